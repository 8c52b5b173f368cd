// GemmReduceScatter's reduction kernel (piece_sum.cuh): one thread an element, grid-stride.
//
//   inputs (dtype):  | from rank first | from first - 1 | ... |   each [rows, width], contiguous
//   mine (f32):      [rows, width], rows mine_ld apart          (this rank's partial product)
//   out (dtype):     [rows, width], rows out_ld apart
//
//   out[i][j] = round((((0 + in_0[i][j]) + in_1[i][j]) + ...) + mine[i][j])
//
// The same f32 additions in the same order as the CPU backend (src/cpu/gemm_reduce_scatter.cpp),
// and one rounding. `out` is read by a peer's copy (or the caller): stored with store_to_peer,
// released when the kernel ends, before the raise kernel after it in stream order.
#include "cuda/overlap/piece_sum.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/launch.cuh"
#include "cuda/memory_ops.cuh"
#include "pmoe/error.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T narrow(float v);
template <> __device__ __forceinline__ float narrow<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) piece_sum_kernel(const PieceSum s) {
  const int64_t elements = s.rows * s.width;
  const T* inputs = static_cast<const T*>(s.inputs);
  T* out = static_cast<T*>(s.out);
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < elements;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / s.width, j = e % s.width;
    float sum = 0.0f;
    for (int n = 0; n < s.count; ++n) {
      const int slot = ((s.first - n) % s.world + s.world) % s.world;
      sum = __fadd_rn(sum, widen(inputs[slot * s.input_stride + e]));
    }
    sum = __fadd_rn(sum, s.mine[i * s.mine_ld + j]);
    store_to_peer(out + i * s.out_ld + j, narrow<T>(sum));
  }
}

}  // namespace

void launch_piece_sum(const PieceSum& sum, DType dtype, int max_blocks, cudaStream_t stream) {
  const int64_t elements = sum.rows * sum.width;
  if (elements == 0) return;
  const int blocks =
      int(std::min<int64_t>(max_blocks, (elements + kBlockThreads - 1) / kBlockThreads));
  switch (dtype) {
    case DType::f32: launch(piece_sum_kernel<float>, blocks, stream, sum); break;
    case DType::bf16: launch(piece_sum_kernel<__nv_bfloat16>, blocks, stream, sum); break;
    case DType::f16: launch(piece_sum_kernel<__half>, blocks, stream, sum); break;
    default: throw Error(detail::cat("GemmReduceScatter: no reduction for ", dtype_name(dtype)));
  }
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
