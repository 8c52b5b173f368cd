// Device-side building blocks of AllToAll's kernels: epoch signals with system-scope release and
// acquire, bounded waits that report through the error word, 16-byte copies, last-block election.
#pragma once

#include <cuda/atomic>

#include "cuda/all_to_all/params.cuh"
#include "cuda/launch.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

__device__ __forceinline__ void signal_release(uint64_t* word, uint64_t value) {
  ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(*word).store(
      value, ::cuda::memory_order_release);
}

__device__ __forceinline__ uint64_t signal_acquire(uint64_t* word) {
  return ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(*word).load(
      ::cuda::memory_order_acquire);
}

// Records the first error of this op; later ones are dropped. The race is decided in device
// memory (atomics on host-mapped memory are not atomic over PCIe); the winner then copies the
// word to its host-mapped mirror, which the host reads without synchronizing.
__device__ __forceinline__ void report(ErrorWord* error, int32_t code, int32_t detail,
                                      int32_t kernel, int32_t value = 0) {
  if (atomicCAS(&error->code, kOk, code) == kOk) {
    error->detail = detail;
    error->kernel = kernel;
    error->value = value;
    volatile ErrorWord* mirror = error->host_mirror;
    mirror->detail = detail;
    mirror->kernel = kernel;
    mirror->value = value;
    __threadfence_system();
    mirror->code = code;  // last: the host reads the code first
    __threadfence_system();
  }
}

// Spins until `word` >= value; false (and an error report naming `peer`) after the timeout.
__device__ __forceinline__ bool wait_signal(uint64_t* word, uint64_t value, uint64_t timeout_ns,
                                           ErrorWord* error, int peer, int kernel) {
  const uint64_t start = global_timer_ns();
  while (signal_acquire(word) < value) {
    if (global_timer_ns() - start > timeout_ns) {
      report(error, kTimeout, peer, kernel);
      return false;
    }
    if (is_fatal(*reinterpret_cast<volatile int32_t*>(&error->code))) return false;
    __nanosleep(100);
  }
  return true;
}

// Copies `bytes` with the calling block's threads: 16-byte accesses when both sides allow.
__device__ __forceinline__ void block_copy(std::byte* dst, const std::byte* src, size_t bytes) {
  const bool vector = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) |
                        bytes) & 15) == 0;
  if (vector) {
    auto* d = reinterpret_cast<int4*>(dst);
    const auto* s = reinterpret_cast<const int4*>(src);
    for (size_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) d[i] = s[i];
  } else {
    for (size_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
  }
}

// True in exactly one thread of the last block of the grid to get here; every earlier write of
// every block is visible to it. Resets the counter for the next launch.
__device__ __forceinline__ bool last_block(uint32_t* counter) {
  __shared__ bool is_last;
  // Every thread's writes, at system scope (peers may be other GPUs over CUDA IPC), before the
  // block counts itself in.
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    is_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    if (is_last) {
      *counter = 0;
      __threadfence();  // the other blocks' writes (fenced before they counted) come first
    }
  }
  __syncthreads();
  return is_last && threadIdx.x == 0;
}

// m for this call: bound_m when given (read on the device, so graph replays can change it),
// clamped to [0, rows given]; route_tokens reports a bound_m outside that range.
__device__ __forceinline__ int requested_tokens(const AllToAllParams& p) {
  return p.bound_m ? *p.bound_m : p.m;
}
__device__ __forceinline__ int tokens_this_call(const AllToAllParams& p) {
  return max(0, min(requested_tokens(p), p.m));
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
