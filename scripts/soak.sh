#!/usr/bin/env bash
# make soak: 10,000 AllToAll dispatch/combine calls over 4 MPI processes on this node, input and
# expert-output dtypes, routing, m and phases changing every call, every result checked against
# the reference, resident memory sampled (growth after the warm-up must stay within 1 MiB).
# Usage: scripts/soak.sh [CALLS] [BUILD_DIR]
set -euo pipefail
calls=${1:-10000}
build=${2:-build/default}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
echo "soak: $calls calls, 4 processes, $(nproc) cores; load: $(uptime | sed 's/.*load/load/')"
exec mpiexec -n 4 --oversubscribe "$build/tests/robustness/soak" "$calls"
