#!/usr/bin/env bash
# Regenerates the committed `pmoe-bench moe` results in bench/results/: the seed 004 sweeps at its
# defaults, then the model presets. Each result is a JSON file ({machine, commit, config, rows,
# gemm_rate}) and a markdown file with the command, the load before and after, and the tables.
#
# usage: scripts/bench_moe.sh [name ...]   (names: batch_size topk feature_dim batch_size_bf16
#        batch_size_ranks_2 batch_size_ep_micro_batches_2 mixtral-8x7b mixtral-8x7b_ep_micro_batches_2 deepseek-v3 qwen3-30b-a3b; default: all)
# Run it on a quiet machine: `uptime` is recorded so that a loaded run can be spotted and redone.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=build/default/tools/pmoe-bench/pmoe-bench
out=bench/results
prefix=${PMOE_RESULTS_PREFIX:-$(date -u +%F)_cpu-$(nproc)core}

declare -A commands=(
  [batch_size]="moe --benchmark_type batch_size"
  [topk]="moe --benchmark_type topk"
  [feature_dim]="moe --benchmark_type feature_dim"
  [batch_size_bf16]="moe --benchmark_type batch_size --dtype bf16"
  [batch_size_ranks_2]="moe --benchmark_type batch_size --ranks 2"
  [batch_size_ep_micro_batches_2]="moe --benchmark_type batch_size --variants ep --micro-batches 2"
  [mixtral-8x7b]="moe --preset mixtral-8x7b"
  [mixtral-8x7b_ep_micro_batches_2]="moe --preset mixtral-8x7b --variants ep --micro-batches 2"
  [deepseek-v3]="moe --preset deepseek-v3"
  [qwen3-30b-a3b]="moe --preset qwen3-30b-a3b --values 128,256,512,1024"
)
order=(batch_size topk feature_dim batch_size_bf16 batch_size_ranks_2
       batch_size_ep_micro_batches_2 mixtral-8x7b mixtral-8x7b_ep_micro_batches_2
       deepseek-v3 qwen3-30b-a3b)
names=("$@")
((${#names[@]})) || names=("${order[@]}")

mkdir -p "$out"
for name in "${names[@]}"; do
  command=${commands[$name]:?unknown result name $name}
  base="$out/${prefix}_moe_${name}"
  echo "== $name: pmoe-bench $command" >&2
  {
    echo "# pmoe-bench $command"
    echo
    echo "Machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
         "commit $(git rev-parse --short=12 HEAD); threads as ranks."
    echo
    echo "Load before: $(uptime | sed 's/.*load/load/')"
    # shellcheck disable=SC2086
    "$bench" $command --json "$base.json"
    echo
    echo "Load after: $(uptime | sed 's/.*load/load/')"
  } > "$base.md"
done
