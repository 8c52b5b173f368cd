// The remote path of a build without NCCL's device API: no peer is ever remote, and a put to one
// is refused (the transport reports it) rather than crashing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/flavor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

struct RemotePath {
  int unused;
};

__device__ inline bool remote_put(const RemotePath&, int, size_t, size_t, size_t, int) {
  return false;
}
__device__ inline bool remote_signal_add(const RemotePath&, int, int) { return false; }
__device__ inline bool remote_flush(const RemotePath&) { return true; }
__device__ inline uint64_t remote_signal_value(const RemotePath&, int) { return 0; }

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
