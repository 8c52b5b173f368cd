// What the MoE layers' kernel files share (moe_row_kernels.cu, moe_routing_kernels.cu,
// moe_tp_sum_kernels.cu; moe_kernels.cuh declares their launches): the grids of the token and
// full-device kernels, a thread's first index and grid stride, f32 <-> element conversion, and
// the block scan. Internal to those files: nothing else includes it.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/check.hpp"
#include "cuda/launch.cuh"
#include "cuda/sm_count.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

constexpr int kMaxBlocks = 64;  // the token kernels (router, gating, TP sum): a grid-stride loop

inline int blocks_for(int64_t elements) {
  return int(std::max<int64_t>(
      1, std::min<int64_t>(kMaxBlocks, (elements + kBlockThreads - 1) / kBlockThreads)));
}

// The grid of the kernels that spread rows or experts over the current device.
// The kernels launched on full_grid() say so in __launch_bounds__ (kBlocksPerSm blocks an SM):
// with the block size alone, ptxas spilled a few registers of the row walk at 40 registers.
inline int full_grid() {
  int device = 0;
  PMOE_CUDA_CHECK(cudaGetDevice(&device));
  return grid_blocks(sm_count(device));
}

__device__ __forceinline__ int64_t first_index() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_step() { return int64_t(gridDim.x) * blockDim.x; }

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T narrow(float v);
template <>
__device__ __forceinline__ float narrow<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// After it, scan[i] = v_0 + ... + v_i over the block's threads (v_i: thread i's `v`). Hillis and
// Steele in shared memory: 2 log2(256) + 1 barriers. Every thread of the block calls it.
template <typename I>
__device__ __forceinline__ void block_inclusive_scan(I* scan, I v) {
  scan[threadIdx.x] = v;
  __syncthreads();
  for (int step = 1; step < kBlockThreads; step *= 2) {
    const I add = int(threadIdx.x) >= step ? scan[threadIdx.x - step] : I(0);
    __syncthreads();  // every thread has read before any writes
    scan[threadIdx.x] += add;
    __syncthreads();
  }
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
