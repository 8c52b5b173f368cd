// The two places where nvcc and the emulated device differ, so that no kernel has to: the launch
// of a kernel and the global timer. Every kernel of pmoe is launched through launch(), with the
// block size below unless it says otherwise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/check.hpp"
#include "cuda/flavor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

constexpr int kBlockThreads = 256;  // threads per block of every pmoe kernel but await_owners

// kernel<<<grid, block, 0, stream>>>(args...) under nvcc; the emulated device's launch under the
// host compiler. Throws pmoe::Error if the launch is refused.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
            const Args&... args) {
#if defined(__CUDACC__)
  kernel<<<grid, block, 0, stream>>>(args...);
  PMOE_CUDA_CHECK(cudaGetLastError());
#else
  PMOE_CUDA_CHECK(::pmoe::emu::launch(grid, block, 0, stream, [=] { kernel(args...); }));
#endif
}

// %globaltimer in nanoseconds (on the emulated device, a steady clock).
__device__ __forceinline__ uint64_t global_timer_ns() {
#if defined(__CUDACC__)
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return ::pmoe::emu::global_timer_ns();
#endif
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
