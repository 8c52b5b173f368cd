#!/usr/bin/env bash
# The checks that need the lent GPU machine, run there through the device tool with the kit that
# scripts/device_kit.sh packs here (prebuilt CUDA tests and pmoe-bench, their libraries, an Open
# MPI runtime):
#
#   run(command="bash scripts/device_checks.sh tests bench", carry=[".devkit"])
#
# Parts, each well inside the tool's 10 minutes a command; logs and JSON go to $OUT:
#   tests    the GPU builds of the CUDA tests: test_cuda_all_to_all_gpu (the CPU cases on one GPU
#            at W = 1, 2, 4, 8, graph replays, a rank that never arrives), test_cuda_grid_gpu
#            (spinning blocks that starve a peer) and test_cuda_ipc_gpu under mpirun -n 2
#   bench    pmoe-bench all-to-all --device cuda, EP 2, 4, 8 sharing the GPU, 1 and 128 tokens
#   overlap  mpirun -n 2 pmoe-bench ag-gemm and gemm-rs, 8 of the 16 cores per rank
#   overlap_cuda  the overlap ops on the GPU: test_cuda_overlap_gpu and test_cuda_graph_gpu, then
#            pmoe-bench ag-gemm / gemm-rs --device cuda, f16, 2 and 4 thread ranks sharing the GPU,
#            pieces moved by the copy engines and (--copy kernel) by a copy kernel on 8 blocks
#   python   builds the Python module with CUDA for the device's Python (the kit cannot: it is
#            built here for this machine's Python), then the whole pytest suite, torch CUDA too
#   gin      the GPU remote path (NCCL GIN) on this one GPU: gin_ring_gpu under mpirun -n 2, each
#            rank its own node (PMOE_GIN_RANKS_PER_NODE=1) so that every peer is remote. NCCL
#            refuses two ranks of one communicator on one GPU and GIN needs an RDMA NIC, so on a
#            one-GPU machine this part is expected to report "unavailable here" with NCCL's
#            reason, and passes; it fails only if the path was set up and then moved wrong bytes
#            or lost a signal. Where the ring check set GIN up, AllToAll then runs over it
#            (pmoe-bench all-to-all --device cuda --ranks-per-node 1 under mpirun -n 2, direct
#            and --mode hierarchical); where
#            not, the part says AllToAll's remote path was not run and why. Not in the default
#            list: run it by name.
# A part that fails is reported and the next one still runs; the exit status says whether all
# passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pmoe-out}
KIT=/tmp/pmoe-kit
mkdir -p "$OUT" "$KIT"
tar -xzf .devkit/kit.tar.gz -C "$KIT" || { echo "no kit: run scripts/device_kit.sh here first"; exit 2; }
# shellcheck source=/dev/null
source "$KIT/env.sh"
echo "kit: $(tr '\n' ' ' < "$KIT/BUILT")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "cores: $(nproc)"

part_tests() {
  timeout 300 test_cuda_all_to_all_gpu --gtest_output="json:$OUT/cuda_tests.json" &&
    timeout 120 test_cuda_grid_gpu && timeout 120 mpirun -n 2 test_cuda_ipc_gpu
}

part_bench() {
  timeout 400 pmoe-bench all-to-all --device cuda --ranks 2,4,8 --tokens 1,128 \
    --json "$OUT/cuda_all_to_all.json" --csv "$OUT/cuda_all_to_all.csv"
}

part_overlap() {
  # --bind-to none: Open MPI binds each of 2 ranks to one core by default, which would put a
  # rank's BLAS threads and its communication thread on that one core.
  local op
  for op in ag-gemm gemm-rs; do
    timeout 250 mpirun -n 2 --bind-to none pmoe-bench "$op" --json "$OUT/overlap_$op.json" ||
      return 1
  done
}

part_overlap_cuda() {
  echo "overlap_cuda: ranks share the one GPU, so a rank's 'transfer' is a device-to-device copy"
  echo "  on the same GPU, competing with the GEMMs for its memory bandwidth (and, for the copy"
  echo "  engines, with nothing else). Not shown here: NVLink or PCIe transfers between GPUs, one"
  echo "  GPU's tensor cores busy while another's copy engines move data, copy engines vs copy"
  echo "  kernels across GPUs. Speedup and comm hidden below are one-GPU figures only."
  timeout 240 test_cuda_overlap_gpu --gtest_output="json:$OUT/cuda_overlap_tests.json" &&
    timeout 60 test_cuda_graph_gpu || return 1
  local op W copy
  for op in ag-gemm gemm-rs; do
    for W in 2 4; do
      for copy in engine kernel; do
        timeout 120 pmoe-bench "$op" 4096 4096 4096 --dtype float16 --iters 10 --ranks "$W" \
          --device cuda --copy "$copy" --json "$OUT/overlap_cuda_${op}_${W}_$copy.json" || return 1
      done
    done
    timeout 120 pmoe-bench "$op" 8192 8192 8192 --dtype float16 --iters 10 --ranks 2 \
      --device cuda --json "$OUT/overlap_cuda_${op}_8192.json" || return 1
  done
}

part_python() {
  local build=/tmp/pmoe-python
  cmake -S . -B "$build" -G Ninja -DPMOE_BUILD_TESTS=OFF -DPMOE_BUILD_TOOLS=OFF \
    -DPMOE_PYTHON=ON -DPMOE_CUDA=ON -DPMOE_CUDA_EMULATOR=OFF -DCMAKE_CUDA_ARCHITECTURES=90a-real \
    -DCMAKE_PREFIX_PATH="$KIT/dev" -DMPI_CXX_COMPILER="$KIT/usr/bin/mpicxx" \
    -DPython_EXECUTABLE="$(command -v python3)" &&
    timeout 400 cmake --build "$build" -j "$(nproc)" &&
    PYTHONPATH="$build/python" PYTHONDONTWRITEBYTECODE=1 timeout 300 \
      python3 -m pytest -q -rs -p no:cacheprovider python/tests
}

# libnccl for the GIN part: PMOE_NCCL_LIBRARY if set, else the toolkit's, the loader's or a pip
# wheel's (the kit does not carry it: some 200 MB, and only this part loads it).
find_libnccl() {
  local candidate
  for candidate in "${PMOE_NCCL_LIBRARY:-}" /usr/local/cuda/lib/libnccl.so.2 \
      /usr/local/cuda/lib64/libnccl.so.2 \
      "$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / {print $NF; exit}')" \
      "$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib", "libnccl.so.2"))' 2>/dev/null)"; do
    [ -n "$candidate" ] && [ -e "$candidate" ] && { echo "$candidate"; return 0; }
  done
  return 1
}

part_gin() {
  if ! command -v gin_ring_gpu >/dev/null; then
    echo "gin: SKIPPED, the kit has no gin_ring_gpu (built where CMake found no NCCL >= 2.28.7)"
    return 0
  fi
  local nccl status
  if ! nccl=$(find_libnccl); then
    echo "gin: SKIPPED, no libnccl.so.2 on this machine (set PMOE_NCCL_LIBRARY to NCCL 2.28's)"
    return 0
  fi
  echo "gin: NCCL from $nccl"
  PMOE_NCCL_LIBRARY="$nccl" PMOE_GIN_RANKS_PER_NODE=1 PMOE_TIMEOUT_S=30 NCCL_DEBUG=WARN \
    timeout 180 mpirun -n 2 -x PMOE_NCCL_LIBRARY -x PMOE_GIN_RANKS_PER_NODE -x PMOE_TIMEOUT_S \
    -x NCCL_DEBUG gin_ring_gpu
  status=$?
  if [ "$status" -eq 77 ]; then
    echo "gin: UNAVAILABLE on this machine (the reason is above; on one GPU, NCCL refuses two ranks" \
         "of one communicator there, and GIN needs an RDMA NIC). Not a failure."
    echo "gin: AllToAll over GIN NOT RUN: it needs the same GIN set-up, which failed above."
    return 0
  fi
  [ "$status" -eq 0 ] || return "$status"
  # GIN works here: AllToAll across the two one-rank nodes, every peer through GIN, each call
  # checked against the reference (a wrong result exits non-zero), then timed.
  echo "gin: AllToAll over GIN (2 processes, --ranks-per-node 1)"
  PMOE_NCCL_LIBRARY="$nccl" PMOE_TIMEOUT_S=30 NCCL_DEBUG=WARN \
    timeout 300 mpirun -n 2 -x PMOE_NCCL_LIBRARY -x PMOE_TIMEOUT_S -x NCCL_DEBUG \
    pmoe-bench all-to-all --device cuda --ranks-per-node 1 --tokens 1,128 --iters 20 \
    --json "$OUT/gin_all_to_all.json" || return $?
  # Hierarchical: each one-rank node's relay is the rank itself, so the relay blocks cross over
  # GIN and the forward is a copy within the rank's own window.
  echo "gin: AllToAll over GIN, hierarchical (2 processes, --ranks-per-node 1)"
  PMOE_NCCL_LIBRARY="$nccl" PMOE_TIMEOUT_S=30 NCCL_DEBUG=WARN \
    timeout 300 mpirun -n 2 -x PMOE_NCCL_LIBRARY -x PMOE_TIMEOUT_S -x NCCL_DEBUG \
    pmoe-bench all-to-all --device cuda --ranks-per-node 1 --mode hierarchical --tokens 1,128 \
    --iters 20 --json "$OUT/gin_all_to_all_hierarchical.json"
}

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests bench overlap overlap_cuda python)
failed=()
for part in "${parts[@]}"; do
  echo "=== $part"
  start=$(date +%s)
  if "part_$part" 2>&1 | tee "$OUT/$part.log"; then
    echo "=== $part passed in $(($(date +%s) - start)) s"
  else
    echo "=== $part FAILED after $(($(date +%s) - start)) s"
    failed+=("$part")
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
