#!/usr/bin/env bash
# Runs peer_loss (see peer_loss.cpp) TRIALS times under mpiexec --enable-recovery, each with 4
# processes, a victim and a seed of its own. Checks, in every trial: that each of the 3 survivors
# printed an "ok" line; that they agree on the first lost call and the next call's number; that the
# trial ended within 30 s; and that no shared-memory segment of the trial is left in /dev/shm.
# Prints each trial's line and, at the end, the kill-to-PeerLost times (min, median, max).
# Usage: run_peer_loss.sh MPIEXEC PEER_LOSS_BINARY TRIALS [OUT_FILE]
#   OUT_FILE, if given, receives one line per survivor: trial victim seed rank ms first last next
set -uo pipefail
mpiexec=$1
binary=$2
trials=$3
out_file=${4:-}
base_prefix=${PMOE_SHM_PREFIX:-pmoe}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
: >"$work/all"

for trial in $(seq 1 "$trials"); do
  victim=$(( (trial * 7) % 4 ))
  seed=$(( 1000 + trial ))
  # Short: the emulated CUDA device's IPC names fit a prefix of at most 25 characters.
  prefix=${base_prefix:0:12}-l$$-$trial
  rm -f "$work/stamp"
  start=$(date +%s.%N)
  PMOE_SHM_PREFIX=$prefix timeout 60 "$mpiexec" -n 4 --oversubscribe --enable-recovery \
    "$binary" "$work/stamp" "$victim" "$seed" >"$work/out" 2>"$work/err"
  end=$(date +%s.%N)
  elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b - a}')
  ok=$(grep -c '^peer-loss: rank [0-9]* ok ' "$work/out")
  verdict=ok
  if [ "$ok" -ne 3 ]; then
    verdict="FAIL: $ok of 3 survivors went on"
  elif [ "$(grep '^peer-loss: rank [0-9]* ok ' "$work/out" | awk '{print $6, $8}' |
            sort -u | wc -l)" -ne 1 ]; then
    verdict="FAIL: the survivors disagree on the lost call or the next call"
  elif awk -v e="$elapsed" 'BEGIN{exit !(e > 30)}'; then
    verdict="FAIL: the trial took ${elapsed} s"
  fi
  leftover=$(find /dev/shm -maxdepth 1 -name "${prefix}.*" 2>/dev/null)
  if [ -n "$leftover" ]; then
    verdict="FAIL: shared memory left behind: $leftover"
    rm -f $leftover
  fi
  echo "trial $trial (victim $victim, seed $seed, ${elapsed} s): $verdict"
  if [ "$verdict" != ok ]; then
    status=1
    cat "$work/out"
    tail -20 "$work/err"
  fi
  grep '^peer-loss: rank [0-9]* ok ' "$work/out" |
    awk -v t="$trial" -v v="$victim" -v s="$seed" \
      '{sub("first=","",$6); sub("last=","",$7); sub("next=","",$8);
        print t, v, s, $3, $5, $6, $7, $8}' >>"$work/all"
done

[ -n "$out_file" ] && cp "$work/all" "$out_file"
sort -g -k5 "$work/all" | awk '{ms[NR] = $5} END {
  if (NR == 0) exit;
  printf "kill to PeerLost over %d survivors: min %.1f ms, median %.1f ms, max %.1f ms\n",
         NR, ms[1], ms[int((NR + 1) / 2)], ms[NR] }'
exit $status
