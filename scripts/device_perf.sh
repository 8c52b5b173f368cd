#!/usr/bin/env bash
# The exchange's performance on one NVIDIA GPU (pmoe's AllToAll against torch and a plain copy,
# each kernel under Nsight Compute), within BUDGET_S = 240 s, from the kit that
# scripts/device_kit.sh packs on the build machine. scripts/device_checks.sh runs it first, as its
# perf part; it also runs alone. The guide: docs/gpu.md, "Running the checks on a GPU machine".
#
#   bash scripts/device_perf.sh [--out DIR]          # on the GPU machine: unpacks the kit
#                                                    # (.devkit/kit.tar.gz, or --kit FILE) to
#                                                    # /tmp/pmoe-perf-kit
#   scripts/device_perf.sh --kit-dir /tmp/pmoe-kit   # a kit already unpacked, its env.sh sourced
#   scripts/device_perf.sh --dry-run [--bench FILE]  # on the build machine, no GPU (ctest's
#                                                    # perf.dry_run)
#
# Run it from the root of a checkout of the commit the kit was built from (it reads tools/ and
# bench/results/). It needs on the GPU machine: nvidia-smi, ncu (Nsight Compute: on the PATH, in
# /usr/local/cuda/bin or /opt/nvidia/nsight-compute; without it the kernels are not profiled and
# the run fails), and python3 with a CUDA build of PyTorch (torch's step and the report).
#
# What runs, in this order, each command under `timeout` for its own bound or what is left of the
# budget (less what the report and packing need), whichever is less:
#   bench      pmoe-bench all-to-all --device cuda, E 256, top-8, H 7168, bf16, ranks sharing the
#              GPU, 50 timed iterations, one run (and JSON) per line of BENCH_RUNS, so that a run
#              cut short loses only its own rows: EP 1 at 1 and 128 tokens a rank (25 s), EP 8 at 1
#              and 128 (35 s), EP 1 at 1024 (40 s), EP 2 and EP 4 at 1 and 128 (15 s each). Its
#              host-side check costs in proportion to EP x E x tokens rows (each rank copies its
#              expert_x and expert_y, E x m rows, to the host: 3.8 GB each at 1024 tokens, whatever
#              the EP size), so EP 1 at 1024 costs what all of EP 8 at 128 does, on one thread, and
#              EP 2, 4, 8 at 1024 would cost 2, 4 and 8 times that (and 60 GB of GPU memory at EP 8):
#              they do not fit the 240 s; add them to BENCH_RUNS for a run of their own. The NCCL
#              all-to-all-v row runs at EP 1 (on one GPU NCCL refuses two ranks).
#   torch      tools/torch_local_exchange.py: for the same (EP, tokens), torch's exchange of the
#              same rows in one process (index_select to expert order, index_add_ back in f32) and
#              a device-to-device copy of the bytes pmoe-bench counts for each op (20 s)
#   ncu        at EP 1, for 1, 128 and 1024 tokens (12, 13 and 25 s): every launch of a kernel
#              whose name matches KERNELS (the exchange kernels, and any new one named for
#              dispatch, combine, route or count) in the check and one timed iteration, its
#              duration (SpeedOfLight) and stall reasons (WarpStateStats), with the NCCL row
#              switched off (PMOE_NCCL_LIBRARY names no file); durations alone where that fails
#   report     tools/device_perf_report.py: the targets beside the results, pmoe/torch and
#              pmoe/copy, the kernels' top stalls, and beside every time the kernel model's
#              prediction for this GPU (tools/pmoe-bench/kernel_model.hpp) from the emulated
#              device's counts committed in PREDICTED (pmoe-bench all-to-all --gpu), so every
#              run checks the model
# Results go into the output directory: --out DIR, else $OUT where set, else /tmp/pmoe-out (the
# work files into /tmp/pmoe-perf). Named with the GPU's model as nvidia-smi gives it, other
# characters than letters, digits, '.', '_' and '-' made '_' (e.g. NVIDIA_H200): perf_GPU.md (the
# report; also printed last), perf_GPU.json (its rows), and perf_GPU_raw.tar.gz (every JSON, CSV,
# log and ncu report). A missed target is printed NOT met in the report, not a failure; the exit
# status says whether every step ran. Three files, with plain names: with device_checks.sh's four
# beside them, the output directory stays within the eight files that the GPU machines this was
# sized for return from a run.
#
# The dry run needs no GPU: the same commands, built by the same functions, with the bench run on
# the emulated device at 1 token a rank and one iteration (so every flag and shape is parsed and
# the check runs), torch's script on the CPU, the report on what they wrote and on a CSV in ncu's
# layout (--self-test), the ncu filter matched against the kernels in src/cuda/all_to_all, every
# program found (ncu only where it is installed: the GPU machine needs it, the build machine does
# not), and the budgets summed. Its output goes to a temporary folder, or to --out DIR.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)

BUDGET_S=240         # the whole part, setup and packing included
SETUP_S=20           # unpacking the kit 10 (a few seconds for ~31 MiB), env.sh's probes 10
REPORT_S=15          # the report 5, packing the results 10: kept back from every step
# The bench runs, in order: "EP TOKENS SECONDS" (the seconds bound the run).
BENCH_RUNS=("1 1,128 25" "8 1,128 35" "1 1024 40" "2 1,128 15" "4 1,128 15")
BENCH_ITERS=50 BENCH_WARMUP=5
TORCH_S=20
NCU_RUNS=("1 12" "128 13" "1024 25")  # "TOKENS SECONDS", at EP 1
KILL_AFTER_S=5
KERNELS='send_tokens|route_rows|land_rows|return_rows|await_owners|reduce_rows|dispatch|combine|route|count'
SHAPE=(--experts 256 --topk 8 --hidden 7168 --dtype bf16)
# The kernel model's predictions for the bench's cases: pmoe-bench JSONs of the emulated device
# with an H100/H200's grid, made here by the command in each file's .md (docs/gpu-all-to-all.md,
# "Predicted against measured"). Regenerate them when the kernels change.
PREDICTED=(bench/results/2026-11-28_cpu-2core_emulated_kernel_model_ep1.json
           bench/results/2026-11-28_cpu-2core_emulated_kernel_model_ep8.json)
MODEL_GPUS=h100-sxm,h200

dry_run=0 archive=.devkit/kit.tar.gz kit_dir="" bench="" out_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --kit) archive=$2; shift ;;
    --kit-dir) kit_dir=$2; shift ;;
    --bench) bench=$2; shift ;;
    --out) out_dir=$2; shift ;;
    *) echo "device_perf.sh: unknown argument '$1' (--dry-run, --kit FILE, --kit-dir DIR," \
            "--bench FILE, --out DIR; docs/gpu.md)" >&2; exit 2 ;;
  esac
  shift
done
started=$(date +%s)
DEADLINE=$((started + BUDGET_S))

if [ "$dry_run" = 1 ]; then
  scratch=$(mktemp -d /tmp/pmoe-perf-dry-run.XXXXXX)
  trap 'rm -rf "$scratch"' EXIT
  WORK=$scratch/work OUT=${out_dir:-$scratch/out}
else
  WORK=/tmp/pmoe-perf OUT=${out_dir:-${OUT:-/tmp/pmoe-out}}
fi
rm -rf "$WORK"
mkdir -p "$WORK" "$OUT"

# The kit: an unpacked one (--kit-dir), else the archive unpacked here. A dry run given --bench
# (ctest: the build's pmoe-bench) needs none.
if [ -n "$kit_dir" ]; then
  [ -n "${PMOE_MACHINE_LD_LIBRARY_PATH+set}" ] || source "$kit_dir/env.sh" ||
    { echo "device_perf.sh: $kit_dir/env.sh found no CUDA libraries (above)"; exit 2; }
elif [ -z "$bench" ]; then
  kit_dir=$([ "$dry_run" = 1 ] && echo "$scratch/kit" || echo /tmp/pmoe-perf-kit)
  rm -rf "$kit_dir"
  mkdir -p "$kit_dir"
  [ -e "$archive" ] || { echo "device_perf.sh: no kit at $archive: pack it with" \
                                "scripts/device_kit.sh on the build machine and copy it here" \
                                "(docs/gpu.md)"; exit 2; }
  timeout 15 tar -xzf "$archive" -C "$kit_dir" || { echo "device_perf.sh: could not unpack $archive"; exit 2; }
  # shellcheck source=/dev/null
  source "$kit_dir/env.sh" || { echo "device_perf.sh: the kit's env.sh found no CUDA libraries (above)"; exit 2; }
fi
BENCH=$(command -v "${bench:-pmoe-bench}") ||
  { echo "device_perf.sh: no ${bench:-pmoe-bench} (the kit's bin, or --bench)"; exit 2; }
MACHINE_LD=${PMOE_MACHINE_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}  # for python3 with torch

# ncu: on the PATH, else where the toolkit or Nsight Compute installs it.
find_ncu() {
  command -v ncu && return 0
  local candidate
  for candidate in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu \
      /usr/local/cuda/nsight-compute-*/ncu; do
    [ -x "$candidate" ] && { echo "$candidate"; return 0; }
  done
  return 1
}

failures=0
fail() { echo "device_perf.sh: FAIL: $*" | tee -a "$WORK/failures" >&2; failures=$((failures + 1)); }

# bounded SECONDS COMMAND...: COMMAND under timeout, for SECONDS or what is left of the budget less
# REPORT_S, whichever is less; 124 without running it where nothing is left.
bounded() {
  local seconds=$1
  shift
  local left=$((DEADLINE - REPORT_S - $(date +%s) - KILL_AFTER_S))
  if [ "$left" -le 0 ]; then
    echo "device_perf.sh: the ${BUDGET_S} s budget is spent; not run: $*"
    return 124
  fi
  [ "$seconds" -gt "$left" ] && seconds=$left
  echo "+ $*" >> "$WORK/commands"
  timeout --kill-after="$KILL_AFTER_S" "$seconds" "$@"
}

# The commands, one function each, used alike by the run and the dry run. Sizes come from the
# variables above; the dry run shrinks only them (tokens, iterations), never a flag.
bench_command() {  # RANKS TOKENS ITERS WARMUP NAME
  echo "$BENCH" all-to-all --device cuda --ranks "$1" --tokens "$2" "${SHAPE[@]}" --iters "$3" \
    --warmup "$4" --gpu "$MODEL_GPUS" --json "$WORK/$5.json" --csv "$WORK/$5.csv"
}
torch_command() {  # ITERS DEVICE PMOE_JSON...
  local iters=$1 device=$2
  shift 2
  local pmoe=()
  for json in "$@"; do pmoe+=(--pmoe "$json"); done
  echo python3 "$ROOT/tools/torch_local_exchange.py" --device "$device" "${pmoe[@]}" \
    --experts 256 --top-k 8 --hidden 7168 --iters "$iters" --out "$WORK/torch_local"
}
ncu_command() {  # NCU TOKENS
  echo "$1" --clock-control none --kernel-name "regex:$KERNELS" \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats \
    --metrics gpu__time_duration.sum -f -o "$WORK/ncu_ep1_$2" \
    "$BENCH" all-to-all --device cuda --ranks 1 --tokens "$2" "${SHAPE[@]}" --iters 1 --warmup 0 \
    --json "$WORK/ncu_bench_$2.json"
}
ncu_durations_command() {  # NCU TOKENS: durations only, where the sections above fail
  echo "$1" --clock-control none --kernel-name "regex:$KERNELS" --metrics gpu__time_duration.sum \
    -f -o "$WORK/ncu_ep1_$2" "$BENCH" all-to-all --device cuda --ranks 1 --tokens "$2" \
    "${SHAPE[@]}" --iters 1 --warmup 0 --json "$WORK/ncu_bench_$2.json"
}
# (No word of these commands holds a space: `read -ra` splits them back into their words.)
words() { read -ra WORDS <<< "$1"; }

gpu_tag() {  # the GPU's model as a file-name part: letters, digits, '.', '_' and '-' only
  tr -c 'A-Za-z0-9._\n-' '_' <<< "$1" | head -1
}

# ---- the dry run, here ---------------------------------------------------------------------------
perf_dry_run() {
  local spec ep tokens seconds json kernel program bench_words=() jsons=()
  local bound=$((SETUP_S + REPORT_S + TORCH_S))
  for spec in "${BENCH_RUNS[@]}"; do
    read -r ep tokens seconds <<< "$spec"
    bound=$((bound + seconds))
  done
  for spec in "${NCU_RUNS[@]}"; do
    read -r tokens seconds <<< "$spec"
    bound=$((bound + seconds))
  done
  [ "$bound" -le "$BUDGET_S" ] ||
    fail "the steps' bounds and what runs around them add up to $bound s, over $BUDGET_S s"

  # The bench, as each run calls it, on the emulated device: 1 token a rank, 1 iteration (each EP
  # size once).
  local seen=" "
  for spec in "${BENCH_RUNS[@]}"; do
    read -r ep tokens seconds <<< "$spec"
    [[ "$seen" == *" $ep "* ]] && continue
    seen+="$ep "
    words "$(bench_command "$ep" 1 1 0 "bench_ep$ep")"
    if ! PMOE_CUDA_EMULATE=1 timeout 60 "${WORDS[@]}" > "$WORK/bench_ep$ep.log" 2>&1; then
      tail -5 "$WORK/bench_ep$ep.log"
      fail "pmoe-bench refused or failed the arguments of the EP $ep run: ${WORDS[*]}"
      continue
    fi
    jsons+=("$WORK/bench_ep$ep.json")
    python3 - "$WORK/bench_ep$ep.json" "$ep" <<'PY' || fail "the EP $ep run's JSON (above)"
import json, sys
doc = json.load(open(sys.argv[1]))
ops = {(r["ranks"], r["op"]) for r in doc["rows"]}
want = {(int(sys.argv[2]), op) for op in ("dispatch", "combine", "nccl_alltoallv")}
assert want <= ops, f"rows {sorted(ops)} lack {sorted(want - ops)}"
assert doc["machine"]["gpu"] == "emulated CUDA device", f"machine gpu: {doc['machine']['gpu']!r}"
PY
  done
  # The program ncu runs, with ncu's own flags cut off: the same bench at 1 token.
  words "$(ncu_command ncu 1)"
  for ((i = 0; i < ${#WORDS[@]}; i++)); do
    [ "${WORDS[i]}" = "$BENCH" ] && { bench_words=("${WORDS[@]:i}"); break; }
  done
  if [ ${#bench_words[@]} -eq 0 ]; then
    fail "the ncu command runs no $BENCH: ${WORDS[*]}"
  elif ! PMOE_CUDA_EMULATE=1 PMOE_NCCL_LIBRARY=/nonexistent/ncu-run-without-nccl timeout 60 \
       "${bench_words[@]}" > "$WORK/ncu_bench.log" 2>&1; then
    tail -5 "$WORK/ncu_bench.log"
    fail "the bench under ncu refused its arguments: ${bench_words[*]}"
  fi
  # ncu's filter: every exchange kernel in the sources matches it, the NCCL row's kernels do not.
  python3 - "$KERNELS" <<'PY' || fail "ncu's kernel filter (above)"
import glob, re, sys
kernels = re.compile(sys.argv[1])
name = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(")
def names(pattern):
    return {n for path in glob.glob(pattern) for n in name.findall(open(path).read())}
exchange = names("src/cuda/all_to_all/*.cu") - {"narrow_indices"}  # int64 indices only
others = names("tools/pmoe-bench/*.cu")
missed = sorted(n for n in exchange if not kernels.search(n))
taken = sorted(n for n in others if kernels.search(n))
assert len(exchange) >= 6 and not missed and not taken, (sorted(exchange), missed, taken)
print(f"ncu filter: takes {', '.join(sorted(exchange))}; leaves {', '.join(sorted(others))}")
PY
  if NCU=$(find_ncu); then
    timeout 20 "$NCU" --version > /dev/null || fail "$NCU --version failed"
  else
    echo "ncu: not on this machine; the GPU machine needs it (Nsight Compute), the dry run does not"
  fi
  # Python: both scripts compile; torch's runs on the CPU over the bench's JSON; the report
  # parses ncu's layout and reads what the others wrote.
  python3 -m py_compile tools/torch_local_exchange.py tools/device_perf_report.py ||
    fail "a Python script does not compile"
  if [ ${#jsons[@]} -gt 0 ] && python3 -c "import torch" 2>/dev/null; then
    words "$(torch_command 1 cpu "${jsons[@]}")"
    timeout 60 "${WORDS[@]}" > "$WORK/torch_local.log" 2>&1 ||
      { tail -5 "$WORK/torch_local.log"; fail "torch_local_exchange.py on the CPU"; }
  else
    echo "torch: not importable here (or no bench JSON); the script is compiled only"
  fi
  python3 tools/device_perf_report.py --self-test || fail "the report's ncu parser"
  python3 - "$WORK/ncu_ep1_1.csv" <<'PY'
import sys
sys.path.insert(0, "tools")
import device_perf_report as r
open(sys.argv[1], "w").write(r.SELF_TEST_CSV)
PY
  # The committed predictions the GPU run's report reads: each has both GPUs' predictions.
  python3 - "${PREDICTED[@]}" <<'PY' || fail "the committed kernel-model predictions (above)"
import json, sys
for path in sys.argv[1:]:
    rows = [r for r in json.load(open(path))["rows"] if r["op"] in ("dispatch", "combine")]
    have = [r for r in rows if {"h100-sxm", "h200"} <= set(r["kernel_counts"]["predicted"])]
    assert rows and len(have) == len(rows), f"{path}: rows without both GPUs' predictions"
print(f"predictions: {len(sys.argv) - 1} files, every op row predicted for h100-sxm and h200")
PY
  local report_args=(--gpu "emulated CUDA device" --out "$OUT/perf_$(gpu_tag "emulated CUDA device")"
                     --ncu "1=$WORK/ncu_ep1_1.csv" --model-gpu h200)
  for json in "${jsons[@]}"; do report_args+=(--pmoe "$json" --predicted "$json"); done
  [ -e "$WORK/torch_local.json" ] && report_args+=(--torch "$WORK/torch_local.json")
  if python3 tools/device_perf_report.py "${report_args[@]}" > "$WORK/report.log" 2>&1; then
    grep -q '^### Targets' "$OUT"/perf_*.md && grep -q '^| EP' "$OUT"/perf_*.md ||
      fail "the report lacks its tables"
    python3 - "$OUT/perf_$(gpu_tag "emulated CUDA device").json" <<'PY' ||
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert rows and all(r["predicted_us"] and r["predicted_host_us"] for r in rows), rows
PY
      fail "the report printed no prediction beside a measurement"
  else
    cat "$WORK/report.log"
    fail "the report"
  fi
  timeout 10 tar -czf "$OUT/perf_$(gpu_tag "emulated CUDA device")_raw.tar.gz" -C "$WORK" . ||
    fail "packing"
  # At most 3 files in the output directory, with plain names (the header says why).
  local files
  files=$(ls "$OUT")
  [ "$(wc -l <<< "$files")" -le 3 ] || fail "more than 3 files in \$OUT: $files"
  ! grep -q '[^A-Za-z0-9._-]' <<< "$files" ||
    fail "a file name with characters other than letters, digits, '.', '_' and '-': $files"
  for program in python3 timeout tar nvidia-smi; do
    command -v "$program" >/dev/null || [ "$program" = nvidia-smi ] ||
      fail "$program is not here"
  done
  echo "dry run: ${#jsons[@]} EP sizes' bench runs on the emulated device, the ncu filter," \
       "torch's script, the report ($(tr '\n' ' ' <<< "$files")); bounded by $bound s (limit" \
       "$BUDGET_S s); $(($(date +%s) - started)) s"
  if [ "$failures" -gt 0 ]; then
    echo "dry run FAILED: $failures finding(s)"
    return 1
  fi
  echo "dry run passed"
}

if [ "$dry_run" = 1 ]; then
  perf_dry_run
  exit $?
fi

# ---- the run, on the GPU ------------------------------------------------------------------------
GPU=$(timeout 5 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
GPU=${GPU:-unknown GPU}
TAG=$(gpu_tag "$GPU")
{
  echo "GPU: $(timeout 5 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
        --format=csv,noheader 2>&1 | head -1)"
  echo "kit: $( [ -n "$kit_dir" ] && tr '\n' ' ' < "$kit_dir/BUILT")"
  echo "cores: $(nproc); started: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} | tee "$WORK/machine.txt"

pmoe_jsons=()
for spec in "${BENCH_RUNS[@]}"; do
  read -r ep tokens seconds <<< "$spec"
  name=bench_ep${ep}_${tokens//,/_}
  echo "=== bench: EP $ep at $tokens tokens a rank"
  words "$(bench_command "$ep" "$tokens" "$BENCH_ITERS" "$BENCH_WARMUP" "$name")"
  bounded "$seconds" "${WORDS[@]}" 2>&1 | tee "$WORK/$name.log" ||
    fail "bench at EP $ep, $tokens tokens (log: $name.log)"
  [ -e "$WORK/$name.json" ] && pmoe_jsons+=("$WORK/$name.json")
done

if [ ${#pmoe_jsons[@]} -gt 0 ]; then
  echo "=== torch's local exchange and a D2D copy of the same bytes"
  words "$(torch_command "$BENCH_ITERS" cuda "${pmoe_jsons[@]}")"
  bounded "$TORCH_S" env LD_LIBRARY_PATH="$MACHINE_LD" PYTHONUNBUFFERED=1 "${WORDS[@]}" 2>&1 |
    tee "$WORK/torch_local.log" || fail "torch_local_exchange.py (log: torch_local.log)"
else
  fail "no bench JSON: torch and the copy not run"
fi

ncu_csvs=()
if NCU=$(find_ncu); then
  for spec in "${NCU_RUNS[@]}"; do
    read -r tokens seconds <<< "$spec"
    echo "=== ncu at EP 1, $tokens tokens"
    words "$(ncu_command "$NCU" "$tokens")"
    bounded "$seconds" env PMOE_NCCL_LIBRARY=/nonexistent/ncu-run-without-nccl "${WORDS[@]}" \
      > "$WORK/ncu_ep1_$tokens.log" 2>&1
    status=$?
    if [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && [ "$status" -ne 137 ]; then
      tail -5 "$WORK/ncu_ep1_$tokens.log"
      echo "ncu with sections failed ($status); durations only"
      words "$(ncu_durations_command "$NCU" "$tokens")"
      bounded "$seconds" env PMOE_NCCL_LIBRARY=/nonexistent/ncu-run-without-nccl "${WORDS[@]}" \
        >> "$WORK/ncu_ep1_$tokens.log" 2>&1
      status=$?
    fi
    if [ "$status" -ne 0 ]; then
      tail -5 "$WORK/ncu_ep1_$tokens.log"
      fail "ncu at $tokens tokens: status $status (log: ncu_ep1_$tokens.log)"
      [ -e "$WORK/ncu_ep1_$tokens.ncu-rep" ] || continue  # a report cut short may still read
    fi
    if timeout 20 "$NCU" --import "$WORK/ncu_ep1_$tokens.ncu-rep" --csv --page raw \
         --print-units base > "$WORK/ncu_ep1_$tokens.csv" 2>> "$WORK/ncu_ep1_$tokens.log"; then
      ncu_csvs+=(--ncu "$tokens=$WORK/ncu_ep1_$tokens.csv")
    else
      fail "ncu --import at $tokens tokens (log: ncu_ep1_$tokens.log)"
    fi
  done
else
  fail "no ncu on this machine (PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-compute)"
fi

echo "=== report ($(($(date +%s) - started)) s so far)"
report_args=(--gpu "$GPU" --out "$OUT/perf_$TAG" "${ncu_csvs[@]}")
for json in "${PREDICTED[@]}"; do report_args+=(--predicted "$json"); done
for json in "${pmoe_jsons[@]}"; do report_args+=(--pmoe "$json"); done
[ -e "$WORK/torch_local.json" ] && report_args+=(--torch "$WORK/torch_local.json")
timeout 10 env LD_LIBRARY_PATH="$MACHINE_LD" python3 tools/device_perf_report.py "${report_args[@]}" \
  > "$WORK/report.log" 2>&1 || fail "the report (log: report.log)"
cp "$OUT/perf_$TAG.md" "$WORK/" 2>/dev/null
timeout 10 tar -czf "$OUT/perf_${TAG}_raw.tar.gz" -C "$WORK" . || fail "packing the results"
cat "$WORK/report.log"
echo "device_perf.sh: $(($(date +%s) - started)) s of $BUDGET_S; $failures failure(s)" \
  "$( [ "$failures" -gt 0 ] && tr '\n' ';' < "$WORK/failures")"
[ "$failures" -eq 0 ]
