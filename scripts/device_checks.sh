#!/usr/bin/env bash
# pmoe's checks that need an NVIDIA GPU, run on the GPU machine from the device kit that
# scripts/device_kit.sh packs on a build machine (every GPU program the build makes, the libraries
# the GPU machine lacks, an Open MPI runtime; the machine's own CUDA libraries are found by the
# kit's env.sh). The guide, with what the GPU machine needs, the order to run things in and what
# each result file means: docs/gpu.md, "Running the checks on a GPU machine".
#
#   bash scripts/device_checks.sh            # on the GPU machine: the default parts, 480 s at most
#   bash scripts/device_checks.sh PART...    # those parts only, by name
#   scripts/device_checks.sh --dry-run       # on the build machine, no GPU: the kit unpacked in a
#                                            # temporary folder, every program's libraries
#                                            # resolved, every part's commands found, the default
#                                            # parts' bound summed
#   --kit FILE                               # the kit to unpack (default .devkit/kit.tar.gz)
#
# Run it from the root of a checkout of the commit the kit was built from (the parts read tools/,
# tests/static/, python/ and bench/results/, and python_build builds the whole tree), with
# .devkit/kit.tar.gz copied there, and .whl/ (scripts/device_wheels.sh) for the python parts. The
# results go into the output directory: $OUT where set, else /tmp/pmoe-out; the work files into
# /tmp/pmoe-results, the unpacked kit into /tmp/pmoe-kit.
#
# The first part of a default run, and of any run that names it, is `perf` where
# scripts/device_perf.sh exists (the exchange's performance, within 240 s; docs/gpu.md).
#
# Every command runs under `timeout` (bounded, below), for its own bound or what is left of its
# part's budget, whichever is less, so a part never takes more than its budget. Budgets, in
# seconds (PMOE_BUDGET_<part>=S overrides one). The checks are sized for 15 minutes of GPU time
# in all, of which the machine's start takes about 2, so that a run of the default parts can be
# repeated once after a fix: a run of tests, bench and static (the default parts where
# device_perf.sh is absent) is bounded by 50 + 150 + 140 + 40 = 380 s, within DEFAULT_LIMIT_S =
# 390 = (900 - 120) / 2. 50 is what runs around the parts: unpacking 20, env.sh's probes 15,
# nvidia-smi 5, packing the results 10.
#   tests         150  every GPU test program: test_cuda_all_to_all_gpu (the CPU cases on one GPU
#                      at W = 1, 2, 4, 8, graph replays, a rank that never arrives),
#                      test_cuda_moe_gpu (the MoE layers), test_cuda_cublas_gpu,
#                      test_cuda_device_utils_gpu, test_cuda_emulator_gpu (the emulator's own
#                      contract, on the hardware it stands in for), test_cuda_grid_gpu (spinning
#                      blocks that starve a peer; again on one hardware queue),
#                      test_cuda_wmma_gpu and test_cuda_grouped_gemm_gpu (the MoE experts'
#                      tensor-core GEMM and its issued rows under Zipf routing),
#                      test_cuda_graph_replay_gpu (pmoe::CudaGraph) and test_cuda_ipc_gpu under
#                      mpirun -n 2
#   bench         140  pmoe-bench all-to-all --device cuda, EP 2, 4, 8 sharing the GPU, 1 and 128
#                      tokens, with its NCCL all-to-all-v row (on one GPU it says why it cannot
#                      run: NCCL refuses two ranks on one GPU), then that row's own check at EP 1;
#                      tools/torch_ata_bench.py on CUDA tensors with NCCL at the same shapes (it
#                      needs W GPUs, and says so on one); tools/ata_ratios.py puts the three side
#                      by side in all_to_all_ratios.json
#   static         40  tests/static's checks of what nvcc compiled, on the kit's pmoe-bench (the
#                      same libpmoe, so the same sm_90a cubins) with this machine's cuobjdump, then
#                      the driver's own view of those cubins on this GPU: registers, local and
#                      shared memory, and the blocks per SM it keeps resident (kernels_sm_90a.md)
#   perf          240  scripts/device_perf.sh, where it exists: first, on a GPU nothing else has
#                      used yet; the default parts are then perf, tests and static (50 + 240 +
#                      150 + 40 = 480 s, within CALL_LIMIT_S = 560 for one invocation), bench by
#                      name, and a rerun without perf is bounded by 240 s
# By name only:
#   moe            60  pmoe-bench moe --device cuda, 1 rank, bf16, batch 1024, at the Mixtral-8x7B and
#                      DeepSeek-V3 presets: the expert stage's TFLOP/s on the library grouped GEMM
#                      (docs/grouped_gemm_library.md), then with PMOE_EXPERT_GEMM=own (pmoe's wmma
#                      kernel) at Mixtral, the same shapes' torch._grouped_mm beside it
#                      (tools/torch_grouped_mm.py; where torch has no CUDA it says why)
#   overlap_cuda  140  test_cuda_overlap_gpu and test_cuda_graph_gpu, then pmoe-bench ag-gemm /
#                      gemm-rs --device cuda, f16, 2 and 4 thread ranks sharing the GPU, pieces
#                      moved by the copy engines and (--copy kernel) by a copy kernel (a default
#                      part until the static one joined: all four do not fit twice in 15 minutes)
#   python        420  on the module python_build installed, with the machine's libraries only
#                      (none of the kit's): importing torch and pmoe (which C++ runtime loads),
#                      then pmoe.torch and a transformers model with ep_implementation="pmoe" on
#                      CUDA tensors (torchrun_cuda.py --transformers-model), the whole pytest
#                      suite (the torch CUDA tests first), and transformers' EP on the CPU (2 ranks)
#   python_build  360  `pip install .` into the machine's Python, as a PyTorch user runs it (no
#                      cmake line of ours, nothing of the kit): TORCH_CUDA_ARCH_LIST=9.0a,
#                      PMOE_MPI=OFF, PMOE_CUDA_EMULATOR=OFF (the image has no Boost), the build
#                      requirements the image lacks from .whl (scripts/device_wheels.sh),
#                      printing the toolchain first and, after, what the module is made of
#                      (scripts/module_report.sh, which fails if it carries its own C++ runtime);
#                      when python is among the parts it starts at the outset, in the background,
#                      beside the GPU parts
#   overlap       240  mpirun -n 2 pmoe-bench ag-gemm and gemm-rs on the CPU, 8 of the 16 cores a
#                      rank
#   gin           300  the GPU remote path (NCCL GIN) on this one GPU: gin_ring_gpu under mpirun
#                      -n 2, each rank its own node. NCCL refuses two ranks of one communicator on
#                      one GPU and GIN needs an RDMA NIC, so on a one-GPU machine it reports
#                      "unavailable here" with NCCL's reason, and passes; it fails only if the
#                      path was set up and then moved wrong bytes or lost a signal. Where the ring
#                      check set GIN up, AllToAll then runs over it (direct and hierarchical).
#   gin_wheel     300  the same, on the NCCL that PyTorch's wheels bring (nvidia-nccl-cu13, 2.30
#                      or later; PMOE_NCCL_LIBRARY points the GIN path at it), where the gin part
#                      uses the one env.sh found (the toolkit's 2.28 first)
# A part that fails is reported and the next one still runs; the exit status says whether all
# passed. Into $OUT go summary.txt (a line a part: passed or FAILED, and its seconds),
# all_to_all_ratios.json (the bench part's three exchanges side by side), kernels_sm_90a.md (the
# static part's tables), results.tar.gz (the logs and JSON of every part), and device_perf.sh's
# three perf_<GPU> files. Eight files at most, with plain names: the GPU machines this was sized
# for return no more from a run, and stop a command after 600 s.
set -uo pipefail
cd "$(dirname "$0")/.."
IMAGE=scripts/device_image.txt
archive=.devkit/kit.tar.gz dry_run=0 parts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --kit) archive=$2; shift ;;
    -*) echo "device_checks.sh: unknown option '$1' (--dry-run, --kit FILE; docs/gpu.md)" >&2
        exit 2 ;;
    *) parts+=("$1") ;;
  esac
  shift
done

declare -A BUDGET=([tests]=150 [bench]=140 [static]=40 [moe]=60 [overlap_cuda]=140 [python]=420
                   [python_build]=360 [overlap]=240 [gin]=300 [gin_wheel]=300 [perf]=240)
DEFAULT_PARTS=(tests bench static)
# The exchange's performance (scripts/device_perf.sh), first where it exists: on a GPU that
# nothing has warmed or fragmented yet, within its own 240 s.
# bench stays by name then: perf measures the exchange, and perf + tests + bench + static would
# not fit one invocation (CALL_LIMIT_S).
PERF_SCRIPT=scripts/device_perf.sh
PERF_LIMIT_S=240
[ -e "$PERF_SCRIPT" ] && DEFAULT_PARTS=(perf tests static)
FIXED_S=50         # around the parts: unpacking 20 (a few seconds for the ~31 MiB kit), env.sh's
                   # probes 15, nvidia-smi 5, packing the results 10
GPU_TIME_S=900     # the GPU time the checks are sized for: 15 minutes, every run together
START_S=120        # what the machine's start takes of it (assumed: a remote machine takes minutes)
DEFAULT_LIMIT_S=$(((GPU_TIME_S - START_S) / 2))  # 390: room for a rerun of the default parts
                                                  # (perf, measured once, not counted)
CALL_LIMIT_S=560   # one invocation's bound, under the 600 s after which the GPU machines this
                   # was sized for stop a command
KILL_AFTER_S=5     # a command that ignores SIGTERM gets SIGKILL this much later
for part in "${!BUDGET[@]}"; do
  override=PMOE_BUDGET_$part
  [ -n "${!override:-}" ] && BUDGET[$part]=${!override}
done
for part in "${parts[@]}"; do
  [ -n "${BUDGET[$part]:-}" ] || { echo "device_checks.sh: no part '$part' (parts:" \
                                     "${!BUDGET[*]})" >&2; exit 2; }
done
# perf, when named, runs first whatever the order given.
if [[ " ${parts[*]} " == *" perf "* ]]; then
  rest=()
  for part in "${parts[@]}"; do [ "$part" = perf ] || rest+=("$part"); done
  parts=(perf "${rest[@]}")
fi

if [ "$dry_run" = 1 ]; then
  scratch=$(mktemp -d /tmp/pmoe-dry-run.XXXXXX)
  trap 'rm -rf "$scratch"' EXIT
  KIT=$scratch/kit WORK=$scratch/results OUT=$scratch/out
else
  KIT=/tmp/pmoe-kit WORK=/tmp/pmoe-results OUT=${OUT:-/tmp/pmoe-out}
fi
rm -rf "$KIT" "$WORK"
mkdir -p "$OUT" "$KIT" "$WORK"
[ -e "$archive" ] || { echo "no kit at $archive: pack it with scripts/device_kit.sh on the build" \
                              "machine and copy it here (docs/gpu.md)"; exit 2; }
timeout 20 tar -xzf "$archive" -C "$KIT" || { echo "could not unpack $archive"; exit 2; }
# The dry run too: the machine that built the kit has the CUDA libraries, so env.sh must find them.
# shellcheck source=/dev/null
source "$KIT/env.sh" || { echo "the kit's env.sh did not find the CUDA libraries (above)"; exit 2; }

# bounded SECONDS COMMAND ARGS...: COMMAND under timeout, for SECONDS or what is left of the
# part's budget, whichever is less. In a dry run it runs nothing: it notes the command and checks
# that the program exists (and the one that env or mpirun would start).
bounded() {
  local seconds=$1
  shift
  if [ "$dry_run" = 1 ]; then
    dry_check "$@"
    return 0
  fi
  local left=$((PART_DEADLINE - $(date +%s) - KILL_AFTER_S))
  if [ "$left" -le 0 ]; then
    echo "$PART: its ${BUDGET[$PART]} s budget is spent; not run: $*"
    return 124
  fi
  [ "$seconds" -gt "$left" ] && seconds=$left
  timeout --kill-after="$KILL_AFTER_S" "$seconds" "$@"
}

part_tests() {
  local status=0 program
  for program in test_cuda_all_to_all_gpu test_cuda_moe_gpu test_cuda_cublas_gpu \
      test_cuda_device_utils_gpu test_cuda_emulator_gpu test_cuda_grid_gpu test_cuda_wmma_gpu \
      test_cuda_grouped_gemm_gpu test_cuda_graph_replay_gpu; do
    echo "--- $program"
    bounded 120 "$program" --gtest_brief=1 --gtest_output="json:$WORK/$program.json" || status=1
  done
  echo "--- test_cuda_grid_gpu, streams on one hardware queue"
  bounded 30 env CUDA_DEVICE_MAX_CONNECTIONS=1 test_cuda_grid_gpu \
    --gtest_filter='DeviceGrid.AWait*' || status=1
  echo "--- mpirun -n 2 test_cuda_ipc_gpu"
  bounded 60 mpirun -n 2 test_cuda_ipc_gpu || status=1
  return "$status"
}

part_bench() {
  local status=0
  # Most of the budget: its JSON is written at the end, and the host-side reference check of EP 8
  # at 128 tokens (1 GB of buffers a rank) dominates.
  bounded 100 pmoe-bench all-to-all --device cuda --ranks 2,4,8 --tokens 1,128 \
    --json "$WORK/cuda_all_to_all.json" --csv "$WORK/cuda_all_to_all.csv" || status=1
  # The NCCL row's own check against the reference: one rank is the one count NCCL allows on one
  # GPU (under mpirun, one process per GPU, it runs at every count).
  echo "--- the NCCL all-to-all-v row at EP 1"
  bounded 20 pmoe-bench all-to-all --device cuda --ranks 1 --tokens 128 --iters 5 \
    --json "$WORK/cuda_all_to_all_ep1.json" || status=1
  echo "--- Torch AtA on CUDA, NCCL backend, the same shapes"
  bounded 30 env LD_LIBRARY_PATH="${PMOE_MACHINE_LD_LIBRARY_PATH:-}" python3 tools/torch_ata_bench.py \
    --device cuda --ep 2,4,8 --tokens 1,128 --out "$WORK/torch_ata_cuda" || status=1
  bounded 10 python3 tools/ata_ratios.py --pmoe "$WORK/cuda_all_to_all.json" \
    --torch "$WORK/torch_ata_cuda.json" --out "$WORK/all_to_all_ratios.json" || status=1
  return "$status"
}

part_moe() {
  local status=0 preset sizes
  for preset in mixtral-8x7b deepseek-v3; do
    echo "--- pmoe-bench moe, $preset, batch 1024, the library grouped GEMM"
    bounded 20 pmoe-bench moe --device cuda --ranks 1 --dtype bf16 --preset "$preset" \
      --benchmark_type batch_size --values 1024 --warmup 3 --iters 10 \
      --json "$WORK/moe_$preset.json" || status=1
    # The bench printed torch's line beside its own already; this call keeps torch's JSON, with the
    # groups pmoe's router made (the bench's JSON has them), not an even split.
    echo "--- torch._grouped_mm, the same expert stage and groups"
    sizes=$(python3 -c 'import json, sys
print(",".join(map(str, json.load(open(sys.argv[1]))["rows"][0]["group_sizes"])))' \
      "$WORK/moe_$preset.json" 2>/dev/null) || sizes=""
    bounded 10 env LD_LIBRARY_PATH="${PMOE_MACHINE_LD_LIBRARY_PATH:-}" python3 \
      tools/torch_grouped_mm.py --preset "$preset" --batch 1024 ${sizes:+--group-sizes "$sizes"} \
      --json "$WORK/torch_gmm_$preset.json" || status=1
  done
  echo "--- pmoe-bench moe, mixtral-8x7b, batch 1024, pmoe's own wmma kernel"
  bounded 15 env PMOE_EXPERT_GEMM=own pmoe-bench moe --device cuda --ranks 1 --dtype bf16 \
    --preset mixtral-8x7b --benchmark_type batch_size --values 1024 --warmup 1 --iters 3 || status=1
  return "$status"
}

part_overlap() {
  # --bind-to none: Open MPI binds each of 2 ranks to one core by default, which would put a
  # rank's BLAS threads and its communication thread on that one core.
  local op
  for op in ag-gemm gemm-rs; do
    bounded 120 mpirun -n 2 --bind-to none pmoe-bench "$op" --json "$WORK/overlap_$op.json" ||
      return 1
  done
}

part_overlap_cuda() {
  echo "overlap_cuda: ranks share the one GPU, so a rank's 'transfer' is a device-to-device copy"
  echo "  on the same GPU, competing with the GEMMs for its memory bandwidth (and, for the copy"
  echo "  engines, with nothing else). Not shown here: NVLink or PCIe transfers between GPUs, one"
  echo "  GPU's tensor cores busy while another's copy engines move data, copy engines vs copy"
  echo "  kernels across GPUs. Speedup and comm hidden below are one-GPU figures only."
  bounded 60 test_cuda_overlap_gpu --gtest_brief=1 \
    --gtest_output="json:$WORK/cuda_overlap_tests.json" || return 1
  bounded 30 test_cuda_graph_gpu --gtest_brief=1 || return 1
  local op W copy
  for op in ag-gemm gemm-rs; do
    for W in 2 4; do
      for copy in engine kernel; do
        bounded 20 pmoe-bench "$op" 4096 4096 4096 --dtype float16 --iters 10 --ranks "$W" \
          --device cuda --copy "$copy" --json "$WORK/overlap_cuda_${op}_${W}_$copy.json" || return 1
      done
    done
    bounded 20 pmoe-bench "$op" 8192 8192 8192 --dtype float16 --iters 10 --ranks 2 \
      --device cuda --json "$WORK/overlap_cuda_${op}_8192.json" || return 1
  done
}

# The exchange's performance part, written and checked by scripts/device_perf.sh itself (its
# --dry-run runs here in the dry run).
part_perf() {
  if [ ! -e "$PERF_SCRIPT" ]; then
    echo "perf: SKIPPED, no $PERF_SCRIPT in this tree"
    return 0
  fi
  # The kit as unpacked here, its env.sh sourced (--kit-dir).
  if [ "$dry_run" = 1 ]; then
    echo "$PART: bash $PERF_SCRIPT --kit-dir $KIT" >> "$WORK/commands"
    timeout 120 bash "$PERF_SCRIPT" --dry-run --kit-dir "$KIT" > "$WORK/perf_dry_run.log" 2>&1 ||
      dry_fail "$PERF_SCRIPT --dry-run failed: $(tail -3 "$WORK/perf_dry_run.log" | tr '\n' ' ')"
    return 0
  fi
  bounded "$PERF_LIMIT_S" bash "$PERF_SCRIPT" --kit-dir "$KIT"
}

# The Python module is built the way `pip install` builds it in a plain PyTorch environment: the
# machine's own compiler, CUDA and libraries, and nothing of the kit: no LIBRARY_PATH or CPATH
# into it, none of its libraries on LD_LIBRARY_PATH, not its mpicxx (PMOE_MPI=OFF: torchrun needs
# no MPI). The module built on the H200 with the kit's paths and MPI carried a copy of
# libstdc++'s stream code and crashed at its first formatted number (docs/gpu.md, "The module
# that crashed on the H200"). OpenBLAS is the machine's own libopenblas.so.0 where it has one (the
# kit's copy where not, said so), with the two headers the kit carries, through a prefix of this
# run's own.
# env's -u options must come before its assignments (it stops at the first NAME=VALUE).
machine_env_make() {
  local unset=(-u OPAL_PREFIX -u PMOE_NCCL_LIBRARY) set=() name dir value
  set+=(PATH="${PMOE_MACHINE_PATH:-$PATH}" LD_LIBRARY_PATH="${PMOE_MACHINE_LD_LIBRARY_PATH:-}")
  # LIBRARY_PATH and CPATH as the machine had them, without what env.sh put first.
  for name in LIBRARY_PATH CPATH; do
    dir=$KIT/dev/lib
    [ "$name" = CPATH ] && dir=$KIT/dev/include
    value=${!name:-}
    value=${value#"$dir"}
    value=${value#:}
    if [ -n "$value" ]; then set+=("$name=$value"); else unset+=(-u "$name"); fi
  done
  machine_env=(env "${unset[@]}" "${set[@]}")
}
machine_env_make
# The python part's build needs CPUs only, so when python is among the parts it starts in the
# background at the outset (python_build_start) and runs beside the GPU parts; part_python waits
# for it. Its own budget bounds it, whatever part is running meanwhile. By name, it is a part.
# It is what a PyTorch user types on a GPU machine, `pip install .` (README, docs/install.md), into
# the machine's Python, with nothing of the kit: pyproject.toml's build (PMOE_CUDA=AUTO finds
# nvcc; BLAS from the scipy-openblas32 wheel, the image having none; the CUDA runtime shared, the
# one torch loads). The machine reaches no index, so the build requirements the image lacks
# (scikit-build-core, scipy-openblas32: scripts/device_wheels.sh) come from .whl, and the build
# runs without isolation against them. Settings, as a user gives them: TORCH_CUDA_ARCH_LIST=9.0a
# (this GPU, one architecture to keep within the budget), PMOE_MPI=OFF (no MPI headers there),
# PMOE_CUDA_EMULATOR=OFF (the image has no Boost.Context, which the emulated device's fibers
# need; a GPU runs the kernels themselves).
PYTHON_BUILD=/tmp/pmoe-python
PYTHON_PIP_INSTALL=(python3 -m pip install -v --no-build-isolation --no-index --find-links .whl
  --no-cache-dir "--config-settings=build-dir=$PYTHON_BUILD" .)
PYTHON_PIP_ENV=(TORCH_CUDA_ARCH_LIST=9.0a PMOE_MPI=OFF PMOE_CUDA_EMULATOR=OFF
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)")
part_python_build() {
  # Wheels the image lacks (scripts/device_wheels.sh: transformers at python/constraints.txt's
  # version into /tmp/site; the build requirements into the machine's Python).
  if compgen -G ".whl/transformers-*.whl" >/dev/null; then
    bounded 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .whl/transformers-*.whl || return 1
  fi
  bounded 60 python3 -m pip install -q --no-index --find-links .whl --no-cache-dir \
    scikit-build-core scipy-openblas32 || return 1
  # The toolchain, before anything is compiled: a build that goes wrong is read from here.
  bounded 20 "${machine_env[@]}" bash scripts/module_report.sh --toolchain
  echo "python_build: ${PYTHON_PIP_ENV[*]} ${PYTHON_PIP_INSTALL[*]}"
  bounded 320 "${machine_env[@]}" "${PYTHON_PIP_ENV[@]}" "${PYTHON_PIP_INSTALL[@]}" &&
    bounded 20 "${machine_env[@]}" bash scripts/module_report.sh "$PYTHON_BUILD"
}
python_build_pid=""
python_build_start() {
  (PART=python_build PART_DEADLINE=$(($(date +%s) + BUDGET[python_build]))
   part_python_build > "$WORK/python_build.log" 2>&1
   echo $? > "$WORK/python_build.rc") &
  python_build_pid=$!
}

part_python() {
  if [ -n "$python_build_pid" ]; then
    # The parts run in a pipeline's subshell, which cannot `wait` for the main shell's child.
    while kill -0 "$python_build_pid" 2>/dev/null; do sleep 1; done
    cat "$WORK/python_build.log"
    [ "$(cat "$WORK/python_build.rc" 2>/dev/null)" = 0 ] ||
      { echo "python: the build failed (above)"; return 1; }
  else
    part_python_build || return 1
  fi
  compgen -G ".whl/transformers-*.whl" >/dev/null &&
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  # pmoe as pip installed it, in the machine's Python (no build tree on the path).
  local status=0 path="${PYTHONPATH:-}"
  # The machine's libraries only: the module links none of the kit's.
  local py=("${machine_env[@]}" PYTHONPATH="$path" PYTHONDONTWRITEBYTECODE=1 PMOE_TIMEOUT_S=60)
  # Seconds: torch and pmoe import together, a communicator formats its first numbers, and the
  # process says which C++ runtime it loaded (python/tests/import_probe.py).
  echo "--- import torch, pmoe; pmoe.torch.communicator() on 1 rank"
  bounded 30 "${py[@]}" python3 python/tests/import_probe.py || status=1
  # pmoe.torch on CUDA tensors, and a transformers model with ep_implementation="pmoe" on them
  # (python/tests/torchrun_cuda.py): first, as nothing of it has run on a GPU yet.
  echo "--- torchrun_cuda.py --transformers-model (2 processes)"
  bounded 200 "${py[@]}" OMP_NUM_THREADS=1 python3 -m torch.distributed.run --standalone \
    --nproc-per-node 2 python/tests/torchrun_cuda.py --transformers-model || status=1
  echo "--- pytest: the torch CUDA tests, then the rest"
  bounded 60 "${py[@]}" python3 -m pytest -q -rs -p no:cacheprovider \
    python/tests/test_torch_cuda.py || status=1
  bounded 180 "${py[@]}" python3 -m pytest -q -rs -p no:cacheprovider python/tests \
    --ignore=python/tests/test_torch_cuda.py || status=1
  # pmoe as transformers' EP implementation, the CPU test as make test runs it (2 ranks): last,
  # since make test runs it too
  echo "--- torchrun_transformers.py on the CPU (2 processes)"
  bounded 120 "${py[@]}" OMP_NUM_THREADS=1 \
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
    python/tests/torchrun_transformers.py --dtypes f32 --edges || status=1
  return "$status"
}

# gin_on NCCL: the GIN checks with that libnccl (a path, or a name the loader finds).
gin_on() {
  local nccl=$1 status
  if ! command -v gin_ring_gpu >/dev/null; then
    echo "gin: SKIPPED, the kit has no gin_ring_gpu (built where CMake found no NCCL >= 2.28.7)"
    return 0
  fi
  echo "gin: NCCL from $nccl"
  bounded 90 env PMOE_NCCL_LIBRARY="$nccl" PMOE_GIN_RANKS_PER_NODE=1 PMOE_TIMEOUT_S=30 \
    NCCL_DEBUG=WARN mpirun -n 2 -x PMOE_NCCL_LIBRARY -x PMOE_GIN_RANKS_PER_NODE -x PMOE_TIMEOUT_S \
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
  bounded 100 env PMOE_NCCL_LIBRARY="$nccl" PMOE_TIMEOUT_S=30 NCCL_DEBUG=WARN \
    mpirun -n 2 -x PMOE_NCCL_LIBRARY -x PMOE_TIMEOUT_S -x NCCL_DEBUG \
    pmoe-bench all-to-all --device cuda --ranks-per-node 1 --tokens 1,128 --iters 20 \
    --json "$WORK/gin_all_to_all.json" || return $?
  # Hierarchical: each one-rank node's relay is the rank itself, so the relay blocks cross over
  # GIN and the forward is a copy within the rank's own window.
  echo "gin: AllToAll over GIN, hierarchical (2 processes, --ranks-per-node 1)"
  bounded 100 env PMOE_NCCL_LIBRARY="$nccl" PMOE_TIMEOUT_S=30 NCCL_DEBUG=WARN \
    mpirun -n 2 -x PMOE_NCCL_LIBRARY -x PMOE_TIMEOUT_S -x NCCL_DEBUG \
    pmoe-bench all-to-all --device cuda --ranks-per-node 1 --mode hierarchical --tokens 1,128 \
    --iters 20 --json "$WORK/gin_all_to_all_hierarchical.json"
}

part_gin() {
  # libnccl as env.sh found it (the kit does not carry it: only this part and pmoe-bench's NCCL
  # row load it); else the loader's.
  gin_on "${PMOE_NCCL_LIBRARY:-libnccl.so.2}"
}

part_static() {
  local measured=$WORK/kernels_sm_90a.json
  bounded 15 python3 tests/static/check_kernels.py measure "$KIT/bin/pmoe-bench" --arch sm_90a \
    --out "$measured" || return 1
  bounded 5 python3 tests/static/check_kernels.py table "$measured" > "$WORK/kernels_sm_90a.md"
  bounded 5 python3 tests/static/check_kernels.py check "$measured" || return 1
  # The driver's view of the same cubins on this GPU (registers, memory, resident blocks).
  bounded 10 python3 tests/static/check_kernels.py driver "$KIT/bin/pmoe-bench" "$measured" \
    >> "$WORK/kernels_sm_90a.md"
}

part_gin_wheel() {
  # The NCCL of PyTorch's wheels (nvidia-nccl-cu13) beside the machine's python3, not the one
  # env.sh found first.
  local nccl
  nccl=$(env LD_LIBRARY_PATH="${PMOE_MACHINE_LD_LIBRARY_PATH:-}" timeout 10 python3 -c '
import glob, os, site
for root in site.getsitepackages() + [site.getusersitepackages()]:
    for lib in sorted(glob.glob(os.path.join(root, "nvidia", "nccl", "lib", "libnccl.so.2"))):
        print(lib)' 2>/dev/null | head -1)
  if [ -z "$nccl" ]; then
    [ "$dry_run" = 1 ] ||
      { echo "gin_wheel: SKIPPED, no nvidia-nccl wheel beside python3"; return 0; }
    nccl=libnccl.so.2
  fi
  gin_on "$nccl"
}

if [ "$dry_run" = 1 ]; then
  # shellcheck source=scripts/device_checks_dry_run.sh
  source scripts/device_checks_dry_run.sh
  dry_run_main
  exit $?
fi

echo "kit: $(tr '\n' ' ' < "$KIT/BUILT")"
timeout 5 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "cores: $(nproc)"
[ ${#parts[@]} -eq 0 ] && parts=("${DEFAULT_PARTS[@]}")
failed=()
[[ " ${parts[*]} " == *" python "* ]] && python_build_start
for part in "${parts[@]}"; do
  echo "=== $part (budget ${BUDGET[$part]} s)"
  start=$(date +%s)
  PART=$part PART_DEADLINE=$((start + BUDGET[$part]))
  if "part_$part" 2>&1 | tee "$WORK/$part.log"; then
    echo "=== $part passed in $(($(date +%s) - start)) s" | tee -a "$WORK/summary.txt"
  else
    echo "=== $part FAILED after $(($(date +%s) - start)) s" | tee -a "$WORK/summary.txt"
    failed+=("$part")
  fi
done
# At most 8 files in $OUT (the header says why): everything in one archive, and the ones to read
# first beside it.
cp "$WORK/summary.txt" "$OUT/"
[ -e "$WORK/all_to_all_ratios.json" ] && cp "$WORK/all_to_all_ratios.json" "$OUT/"
[ -e "$WORK/kernels_sm_90a.md" ] && cp "$WORK/kernels_sm_90a.md" "$OUT/"
timeout 10 tar -czf "$OUT/results.tar.gz" -C "$WORK" .
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
