#!/usr/bin/env bash
# Runs dead_peer (see dead_peer.cpp) under mpiexec --enable-recovery and checks that each of the
# 3 survivors named the dead rank within 1 s, that the whole run ended within a few seconds of
# the kill, and that no shared-memory segment of this run is left in /dev/shm.
# Usage: run_dead_peer.sh MPIEXEC DEAD_PEER_BINARY   (PMOE_SHM_PREFIX names this run's segments)
set -uo pipefail
mpiexec=$1
binary=$2
# A prefix of this run's own, so that the check below sees only its segments, not those of tests
# that ctest runs beside it.
prefix=${PMOE_SHM_PREFIX:-pmoe}-dead$$
export PMOE_SHM_PREFIX=$prefix
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

start=$(date +%s.%N)
# The survivors leave by _exit() and the launcher's own status says nothing about them: the
# lines they print are the verdict. 60 s bounds a launcher that would wait for ever.
timeout 60 "$mpiexec" -n 4 --oversubscribe --enable-recovery "$binary" "$work/stamp" \
  >"$work/out" 2>"$work/err"
end=$(date +%s.%N)
cat "$work/out"
status=0
ok=$(grep -c '^dead-peer: rank [0-2] ok ' "$work/out")
if [ "$ok" -ne 3 ]; then
  echo "FAIL: $ok of 3 survivors named the dead rank within 1 s; launcher's stderr:"
  cat "$work/err"
  status=1
fi
if grep -q 'FAIL' "$work/out"; then status=1; fi
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b - a}')
echo "mpiexec ran ${elapsed} s in all (start-up, 100..400 ms of calls, the kill, the survivors' exit)"
# Without the watch the survivors would sit out PMOE_TIMEOUT_S (60 s in ctest).
if awk -v e="$elapsed" 'BEGIN{exit !(e > 20)}'; then
  echo "FAIL: the survivors did not exit within a few seconds"; status=1
fi
leftover=$(find /dev/shm -maxdepth 1 -name "${prefix}.*" 2>/dev/null)
if [ -n "$leftover" ]; then
  echo "FAIL: shared memory left behind:"; echo "$leftover"; status=1
fi
exit $status
