// i64 indices (torch.topk's type) narrowed to the i32 the kernels read, on the rank's stream
// before dispatch(send) and combine(send), so that a CUDA graph captures it too. A value outside
// int32 becomes INT32_MIN, which the range check then reports as a bad index (and skips), never
// as the expert its low 32 bits would name.
#include "cuda/all_to_all/params.cuh"  // first: see there

#include <climits>

#include "cuda/all_to_all/kernels.hpp"
#include "cuda/launch.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

__global__ void __launch_bounds__(kBlockThreads)
    narrow_indices(const int64_t* wide, int32_t* narrow, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t v = wide[i];
    narrow[i] = v >= INT32_MIN && v <= INT32_MAX ? int32_t(v) : INT32_MIN;
  }
}

}  // namespace

void launch_narrow_indices(const int64_t* wide, int32_t* narrow, int64_t n, cudaStream_t stream,
                           int blocks) {
  if (n > 0) launch("narrow_indices", narrow_indices, blocks, stream, wide, narrow, n);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
