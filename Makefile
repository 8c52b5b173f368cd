# The README's entry points. Each installs what is missing (scripts/setup.sh), configures,
# builds and runs; nothing else is needed on a fresh machine.
.PHONY: all setup build test test-asan test-tsan bench soak fuzz mutation clean

JOBS ?= $(shell nproc)

all: build

setup:
	@scripts/setup.sh

build: setup
	@cmake --preset default >/dev/null
	@cmake --build --preset default -j $(JOBS)

test: build
	@ctest --preset default -j $(JOBS)

# Address + undefined-behaviour sanitizers over the CPU tests and the emulated CUDA tests. Leaks are
# not judged (ASAN_OPTIONS=detect_leaks=0, CMakePresets.json): Open MPI's own allocations leak
# (docs/emulated-device.md, "Sanitizers").
test-asan: setup
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)
	@ctest --preset asan -j $(JOBS)

# ThreadSanitizer over the thread-rank tests of the CPU backend and the emulated CUDA kernels
# (MPI processes are left out: Open MPI is not built for TSan). Waits are bounded at 400 s there
# (PMOE_TIMEOUT_S, CMakePresets.json), not 60: the heaviest emulated cases run 2-3x slower than
# under ASan, and on a loaded 2-core machine a healthy peer took over 60 s to arrive.
test-tsan: setup
	@cmake --preset tsan >/dev/null
	@cmake --build --preset tsan -j $(JOBS)
	@ctest --preset tsan -j $(JOBS)

# A quick pass of every benchmark (pmoe-bench all): all-to-all at the DeepSeek-V3 shape, the
# seed's MoE batch sweep, AllGather+GEMM and GEMM+ReduceScatter; each checked before it is timed.
# JSON lands in build/bench/; the committed results in bench/results/ come from fuller runs.
bench: build
	@build/default/tools/pmoe-bench/pmoe-bench all --out build/bench

# 10,000 checked AllToAll calls over 4 MPI processes, everything changing per call, resident
# memory sampled (docs/robustness.md). `make test` runs 500 of them.
soak: build
	@scripts/soak.sh 10000

# libFuzzer (Clang) with ASan+UBSan over each fuzz target, FUZZ_SECONDS each (default 120).
# `make test` runs the same targets for a few seconds through a replay driver.
FUZZ_SECONDS ?= 120
fuzz: setup
	@scripts/fuzz.sh $(FUZZ_SECONDS)

# The emulated device's mutation suite: each barrier, fence, ordering, scope, loop bound, offset
# and grid stride of the CUDA kernels changed in turn, the emulated CUDA tests run after each
# (lean build in build/mutation); the table lands in docs/emulated-device.md. About an hour
# (about 100 mutants; 97 took 53 min on the loaded 2-core VM); `scripts/mutation.py --only
# REGEX --doc ... --merge` reruns a few and replaces only their rows.
mutation: setup
	@scripts/mutation.py --doc docs/emulated-device.md

clean:
	rm -rf build
