// A self-check of the GPU remote path on real hardware (scripts/device_checks.sh, part gin):
// every rank puts a pattern to the rank one node further on, through every call of the remote
// path, and checks what the rank one node back put into it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/flavor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

class NcclGin;

struct GinRingResult {
  bool arrived = false;     // both signals reached `round` before the timeout
  int64_t wrong_bytes = 0;  // of the 2 * chunk bytes received, how many differ from the pattern
};

// Collective (every rank of `gin`, round r = 1, 2, ... on all alike). Needs 3 * chunk region bytes
// and 2 signal slots: region [0, chunk) is the source; the rank one node further on receives it at
// [chunk, 2 chunk) with put_signal(slot 0), and at [2 chunk, 3 chunk) by put, then signal_add
// (slot 1); flush before the end. Runs on `stream` and waits for it. Throws pmoe::Error on a bad
// chunk or a CUDA failure; a peer that never signals is `arrived = false` after timeout_ns.
GinRingResult run_gin_ring_check(const NcclGin& gin, cudaStream_t stream, size_t chunk,
                                 uint64_t round, uint64_t timeout_ns);

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
