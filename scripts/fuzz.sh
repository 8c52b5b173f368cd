#!/usr/bin/env bash
# make fuzz: builds the fuzz targets with Clang's libFuzzer under address + undefined-behaviour
# sanitizers (the fuzz preset) and runs each for FUZZ_SECONDS (default 120). Each target starts
# from its committed seed corpus (tests/fuzz/corpus/NAME, read only) and grows a working corpus
# in build/fuzz/corpus/NAME; a crash leaves its input in build/fuzz/artifacts/ and fails the run.
# Replay one: build/fuzz/tests/fuzz/fuzz_NAME build/fuzz/artifacts/crash-...
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
seconds=${1:-${FUZZ_SECONDS:-120}}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(all_to_all moe tensor_args)
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"
mkdir -p build/fuzz/artifacts
# Open MPI's and OpenBLAS's own allocations at exit are not pmoe's leaks.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for name in "${targets[@]}"; do
  corpus=build/fuzz/corpus/$name
  mkdir -p "$corpus"
  echo "fuzz: $name for $seconds s; load: $(uptime | sed 's/.*load/load/')"
  if ! PMOE_FUZZ_STATS=1 "build/fuzz/tests/fuzz/fuzz_$name" -max_total_time="$seconds" \
      -timeout=60 -rss_limit_mb=4096 -artifact_prefix=build/fuzz/artifacts/ -print_final_stats=1 \
      "$corpus" "tests/fuzz/corpus/$name" 2>"build/fuzz/$name.log"; then
    echo "fuzz: $name FOUND A BUG; see build/fuzz/$name.log and build/fuzz/artifacts/"
    tail -30 "build/fuzz/$name.log"
    status=1
  fi
  grep -E "^pmoe fuzz:|stat::number_of_executed_units|stat::peak_rss_mb|^#[0-9]+.*DONE" \
    "build/fuzz/$name.log" | sed "s/^/  $name: /" || true
done
exit $status
