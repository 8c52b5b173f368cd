#!/usr/bin/env bash
# Runs each pmoe-bench subcommand that takes --plot on a tiny shape and checks that a PNG came out.
# Arguments: <pmoe-bench> <scratch dir>.
set -euo pipefail
bench=$1 out=$2
rm -rf "$out" && mkdir -p "$out"
"$bench" all-to-all --ranks 1,2 --tokens 1,4 --experts 8 --topk 2 --hidden 64 --iters 2 \
         --warmup 0 --plot "$out/all_to_all.png" >/dev/null
"$bench" moe --ranks 2 --values 8,16 --iters 2 --warmup 0 --plot "$out/moe.png" >/dev/null
"$bench" ag-gemm 64 64 64 --iters 2 --warmup 0 --plot "$out/ag_gemm.png" >/dev/null
"$bench" gemm-rs 64 64 64 --iters 2 --warmup 0 --plot "$out/gemm_rs.png" >/dev/null
for png in all_to_all moe ag_gemm gemm_rs; do
  # A PNG starts with \x89PNG.
  [[ "$(head -c 4 "$out/$png.png" | tail -c 3)" == "PNG" ]] || { echo "no PNG: $png" >&2; exit 1; }
done
echo "4 plots drawn"
