// The remote path of an nvcc build without NCCL's device API: no peer is ever remote there
// (open_gpu_remote_path refuses a communicator whose ranks span nodes), so every call moves
// nothing and the put functions return false for the caller to report.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/flavor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

struct RemotePath {};

__device__ __forceinline__ bool remote_ready(const RemotePath&) { return false; }
__device__ __forceinline__ bool remote_put(const RemotePath&, int, size_t, size_t, size_t) {
  return false;
}
__device__ __forceinline__ bool remote_put_signal(const RemotePath&, int, size_t, size_t, size_t,
                                                  int) {
  return false;
}
__device__ __forceinline__ bool remote_signal_add(const RemotePath&, int, int) { return false; }
__device__ __forceinline__ void remote_flush(const RemotePath&) {}
__device__ __forceinline__ uint64_t remote_read_signal(const RemotePath&, int) { return 0; }

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
