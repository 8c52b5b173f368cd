// The arithmetic of combine's sums, shared by the source's reduction (combine.cu) and a relay's
// node sums (node_sum.cuh): rows of f32, bf16 or f16 read as f32, w * row added in f32 with the
// multiply and the add rounded separately (no FMA), as the CPU backend does, so that the same
// order gives the same bits everywhere.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/all_to_all/device_utils.cuh"  // first: see params.cuh

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

__device__ __forceinline__ float load(const float* p, int i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float load(const __half* p, int i) { return __half2float(p[i]); }
__device__ __forceinline__ void store(float* p, int i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(__half* p, int i, float v) { p[i] = __float2half_rn(v); }

// Elements one thread sums at once, loaded and stored in one access each.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// acc[c] += w * row[h + c] for c < C: one aligned pack load when C > 1.
template <int C, typename In>
__device__ __forceinline__ void add_scaled(float (&acc)[C], const In* row, int h, float w) {
  if constexpr (C == 1) {
    const In in = load_global(row + h);
    acc[0] = __fadd_rn(acc[0], __fmul_rn(w, load(&in, 0)));
  } else {
    const Pack<In, C> in = load_global(reinterpret_cast<const Pack<In, C>*>(row + h));
    for (int c = 0; c < C; ++c) acc[c] = __fadd_rn(acc[c], __fmul_rn(w, load(in.v, c)));
  }
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
