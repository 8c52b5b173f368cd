// The two places where nvcc and the emulated device differ, so that no kernel has to: the launch
// of a kernel and the global timer. Every kernel of pmoe is launched through launch(), and the
// launch settings live here only: the block size (which kernels also name in
// __launch_bounds__(kBlockThreads) and size their __shared__ tables by) and the grid rule.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/check.hpp"
#include "cuda/flavor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

constexpr int kBlockThreads = 256;  // threads per block of every pmoe kernel
constexpr int kBlocksPerSm = 2;     // grid of the kernels that spread work over the device

// The grid of a kernel that spreads its work over a device with `sms` multiprocessors.
inline int grid_blocks(int sms) { return kBlocksPerSm * (sms > 0 ? sms : 1); }

// kernel<<<grid, block, 0, stream>>>(args...) under nvcc; the emulated device's launch under the
// host compiler. Throws pmoe::Error if the launch is refused. Tests that probe the device with
// other block shapes call this one; pmoe's kernels call launch() below.
template <typename... Params, typename... Args>
void launch_shaped(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                   const Args&... args) {
#if defined(__CUDACC__)
  kernel<<<grid, block, 0, stream>>>(args...);
  PMOE_CUDA_CHECK(cudaGetLastError());
#else
  PMOE_CUDA_CHECK(::pmoe::emu::launch(grid, block, 0, stream, [=] { kernel(args...); }));
#endif
}

// A pmoe kernel: `grid` blocks of kBlockThreads threads.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), int grid, cudaStream_t stream, const Args&... args) {
  launch_shaped(kernel, dim3(unsigned(grid)), dim3(kBlockThreads), stream, args...);
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
