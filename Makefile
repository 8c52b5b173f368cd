# The README's entry points. Each installs what is missing (scripts/setup.sh), configures,
# builds and runs; nothing else is needed on a fresh machine.
.PHONY: all setup build test test-asan bench clean

JOBS ?= $(shell nproc)

all: build

setup:
	@scripts/setup.sh

build: setup
	@cmake --preset default >/dev/null
	@cmake --build --preset default -j $(JOBS)

test: build
	@ctest --preset default -j $(JOBS)

# Address + undefined-behaviour sanitizers over the CPU tests.
test-asan: setup
	@cmake --preset asan >/dev/null
	@cmake --build --preset asan -j $(JOBS)
	@ctest --preset asan -j $(JOBS)

# Until the full benchmark suite lands: the dispatch/combine self-check with timings, at the
# DeepSeek-V3 shape (E=256, top-k 8, H=7168, bf16), 2 and 4 thread ranks, 1 and 128 tokens.
bench: build
	@mkdir -p bench/results
	@build/default/tools/pmoe-bench/pmoe-bench all-to-all --ranks 2,4 --tokens 1,128 \
	    --json build/default/all_to_all.json

clean:
	rm -rf build
