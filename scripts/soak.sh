#!/usr/bin/env bash
# make soak: 10,000 AllToAll dispatch/combine calls over 4 MPI processes on this node, once through
# shared memory and once through MPI messages (as between nodes); input and expert-output dtypes,
# routing, m and phases change every call, every result is checked against the reference, and
# resident memory is sampled (growth after the warm-up must stay within 1 MiB).
# Usage: scripts/soak.sh [CALLS] [BUILD_DIR]
set -euo pipefail
calls=${1:-10000}
build=${2:-build/default}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# Both transports: node-local shared memory, then every peer through MPI messages.
for shm in 1 0; do
  echo "soak: $calls calls, 4 processes, $(nproc) cores, PMOE_MPI_SHM=$shm;" \
       "load: $(uptime | sed 's/.*load/load/')"
  PMOE_MPI_SHM=$shm mpiexec -n 4 --oversubscribe -x PMOE_MPI_SHM \
    "$build/tests/robustness/soak" "$calls"
done
