#!/usr/bin/env bash
# Fails if any shared-memory segment whose name starts with PMOE_SHM_PREFIX is in /dev/shm.
set -u
prefix=${PMOE_SHM_PREFIX:?PMOE_SHM_PREFIX must name this test run\'s segments}
left=$(find /dev/shm -maxdepth 1 -name "${prefix}.*" -printf '%f %m %s bytes\n' 2>/dev/null)
if [ -n "$left" ]; then
  echo "shared memory left behind under /dev/shm:"
  echo "$left"
  exit 1
fi
echo "no segment named ${prefix}.* under /dev/shm"
