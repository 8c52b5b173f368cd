// Where a rank's remote signals start. GIN's signals are NCCL's words: gin.h promises no starting
// value (2.28.9 happens to zero them; the emulated device starts them at a seeded non-zero value),
// and NVIDIA's own example reads the signal before it counts. So each op reads every one of its
// rank's slots once, through the flavour's remote_signal_value (readSignal), when it is built:
// before the barrier that ends construction, after which peers may add. Transport::
// remote_baseline holds the result, and read_signal() counts from it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/check.hpp"
#include "cuda/launch.cuh"
#include "cuda/transport/transport.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

// baseline[s] = this rank's remote signal s, for s in [0, slots). One thread: a few hundred words
// at most, once per op.
template <typename Path>
__global__ void __launch_bounds__(kBlockThreads)
    read_signal_baselines(const Path path, int slots, uint64_t* baseline) {
  if (threadIdx.x != 0) return;
  for (int s = 0; s < slots; ++s) baseline[s] = remote_signal_value(path, s);
}

// `slots` words of device memory with each slot's baseline, read on `stream` (and waited for).
// The caller frees it with cudaFree.
inline uint64_t* capture_signal_baselines(const RemotePath& path, int slots, cudaStream_t stream) {
  uint64_t* baseline = nullptr;
  PMOE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&baseline), sizeof(uint64_t) * size_t(slots)));
  try {
    launch("read_signal_baselines", read_signal_baselines<RemotePath>, 1, stream, path, slots,
           baseline);
    PMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    (void)cudaFree(baseline);
    throw;
  }
  return baseline;
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
