// The places where nvcc and the emulated device differ, so that no kernel has to: the launch of
// a kernel (plain, or dependent: programmatic dependent launch), the global timer and a
// streaming load. Every kernel of pmoe is launched through launch(), and the
// launch settings live here only: the block size (which kernels also name in
// __launch_bounds__(kBlockThreads) and size their __shared__ tables by) and the grid rule.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/check.hpp"
#include "cuda/flavor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

// `#pragma unroll` for nvcc, nothing for the host compiler (which warns on it): before a loop whose
// constant trip count must unroll, e.g. to keep an array it indexes in registers.
#if defined(__CUDACC__)
#define PMOE_UNROLL _Pragma("unroll")
#else
#define PMOE_UNROLL
#endif

constexpr int kBlockThreads = 256;  // threads per block of every pmoe kernel
constexpr int kBlocksPerSm = 2;     // grid of the kernels that spread work over the device

// The grid of a kernel that spreads its work over a device with `sms` multiprocessors.
inline int grid_blocks(int sms) { return kBlocksPerSm * (sms > 0 ? sms : 1); }

// kernel<<<grid, block, 0, stream>>>(args...) under nvcc; the emulated device's launch under the
// host compiler. Throws pmoe::Error if the launch is refused. Tests that probe the device with
// other block shapes call this one; pmoe's kernels call launch() below.
// `name` (a string literal) names the kernel in the emulated device's counts of its critical
// path (include/pmoe/diagnostics/kernel_counts.hpp); nvcc ignores it.
template <typename... Params, typename... Args>
void launch_shaped(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                   cudaStream_t stream, const Args&... args) {
#if defined(__CUDACC__)
  (void)name;
  kernel<<<grid, block, 0, stream>>>(args...);
  PMOE_CUDA_CHECK(cudaGetLastError());
#else
  PMOE_CUDA_CHECK(::pmoe::emu::launch(grid, block, 0, stream, [=] { kernel(args...); }, name));
#endif
}
template <typename... Params, typename... Args>
void launch_shaped(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                   const Args&... args) {
  launch_shaped(static_cast<const char*>(nullptr), kernel, grid, block, stream, args...);
}

// A pmoe kernel: `grid` blocks of kBlockThreads threads; named or not.
template <typename... Params, typename... Args>
void launch(const char* name, void (*kernel)(Params...), int grid, cudaStream_t stream,
            const Args&... args) {
  launch_shaped(name, kernel, dim3(unsigned(grid)), dim3(kBlockThreads), stream, args...);
}
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), int grid, cudaStream_t stream, const Args&... args) {
  launch(static_cast<const char*>(nullptr), kernel, grid, stream, args...);
}

// A kernel that may start launching before the kernel before it on the stream has finished
// (programmatic dependent launch, Hopper on): its blocks become resident once every block of
// the one before called allow_dependent_grid() (or ended), and it must call
// wait_for_prior_grid() before it reads anything that one wrote. Elsewhere, and on the emulated
// device, a plain launch: the kernel starts after the one before ends, and both calls do nothing.
template <typename... Params, typename... Args>
void launch_dependent(const char* name, void (*kernel)(Params...), int grid,
                      cudaStream_t stream, const Args&... args) {
#if defined(__CUDACC__)
  static const bool supported = [] {
    int device = 0, major = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) ==
               cudaSuccess &&
           major >= 9;
  }();
  if (supported) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(grid));
    config.blockDim = dim3(kBlockThreads);
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    PMOE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, Params(args)...));
    return;
  }
#endif
  launch(name, kernel, grid, stream, args...);
}

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// 16 bytes of memory that nothing writes while the kernel runs (its inputs), read without
// allocating in L1: each is read once, and L1 is better left to what is read again.
__device__ __forceinline__ int4 load_streaming(const int4* p) {
#if defined(__CUDA_ARCH__)
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
#else
#if !defined(__CUDACC__)
  ::pmoe::emu::count_bytes_read(sizeof(int4));  // the emulated device counts what kernels read
#endif
  return *p;
#endif
}

// What the emulated device cannot see for itself in a kernel's critical path, said by the kernel
// (include/pmoe/diagnostics/kernel_counts.hpp; barrier rounds and blocks that spin it counts on
// its own). On a GPU both are nothing.
// The calling block is about to wait for another block of its own grid.
__device__ __forceinline__ void count_wait_on_own_grid() {
#if !defined(__CUDACC__)
  ::pmoe::emu::count_wait_on_own_grid();
#endif
}
// The calling thread runs `n` more iterations of a loop whose length grows with the tokens,
// experts or ranks.
__device__ __forceinline__ void count_serial_steps(long long n) {
#if defined(__CUDACC__)
  (void)n;
#else
  ::pmoe::emu::count_serial_steps(n);
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
