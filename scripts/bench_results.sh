#!/usr/bin/env bash
# Regenerates committed pmoe-bench results in bench/results/. Each result is a JSON file
# ({machine, commit, config, rows, ...}) and a markdown file with the command, the machine, the
# commit, the load before and after, and the tables pmoe-bench printed.
#
# usage: scripts/bench_results.sh [name ...]
#   docs (the default): every result docs/benchmarks.md shows: all_to_all, moe_batch_size,
#         moe_topk, moe_feature_dim, moe_batch_size_ranks_2, ag_gemm, gemm_rs
#   more: moe_batch_size_bf16 moe_batch_size_ep_micro_batches_2 moe_mixtral-8x7b
#         moe_mixtral-8x7b_ep_micro_batches_2 moe_deepseek-v3 moe_qwen3-30b-a3b (the presets need
#         up to 6 GB and minutes each)
# Run it on a quiet machine: `uptime` is recorded so that a loaded run can be spotted and redone.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=build/default/tools/pmoe-bench/pmoe-bench
out=bench/results
prefix=${PMOE_RESULTS_PREFIX:-$(date -u +%F)_cpu-$(nproc)core}

declare -A commands=(
  [all_to_all]="all-to-all"
  [moe_batch_size]="moe --benchmark_type batch_size"
  [moe_topk]="moe --benchmark_type topk"
  [moe_feature_dim]="moe --benchmark_type feature_dim"
  [moe_batch_size_ranks_2]="moe --benchmark_type batch_size --ranks 2"
  [ag_gemm]="ag-gemm"
  [gemm_rs]="gemm-rs"
  [moe_batch_size_bf16]="moe --benchmark_type batch_size --dtype bf16"
  [moe_batch_size_ep_micro_batches_2]="moe --benchmark_type batch_size --variants ep --micro-batches 2"
  [moe_mixtral-8x7b]="moe --preset mixtral-8x7b"
  [moe_mixtral-8x7b_ep_micro_batches_2]="moe --preset mixtral-8x7b --variants ep --micro-batches 2"
  [moe_deepseek-v3]="moe --preset deepseek-v3"
  [moe_qwen3-30b-a3b]="moe --preset qwen3-30b-a3b --values 128,256,512,1024"
)
docs=(all_to_all moe_batch_size moe_topk moe_feature_dim moe_batch_size_ranks_2 ag_gemm gemm_rs)
names=("$@")
((${#names[@]})) || names=(docs)
if [[ " ${names[*]} " == *" docs "* ]]; then names=("${docs[@]}"); fi

mkdir -p "$out"
for name in "${names[@]}"; do
  command=${commands[$name]:?unknown result name $name}
  base="$out/${prefix}_${name}"
  echo "== $name: pmoe-bench $command" >&2
  {
    echo "# pmoe-bench $command"
    echo
    echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
         "commit $(git rev-parse --short=12 HEAD); threads as ranks."
    echo
    echo "Load before: $(uptime | sed 's/.*load/load/')"
    # shellcheck disable=SC2086
    "$bench" $command --json "$base.json" $([[ $command == moe* || $command == all-to-all* ]] &&
                                             echo "--plot $base.png")
    echo
    echo "Load after: $(uptime | sed 's/.*load/load/')"
  } > "$base.md"
done
