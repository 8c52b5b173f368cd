// The i32 slots the exchange kernels read, made from the caller's indices on the rank's stream
// before dispatch(send) and combine(send), so that a CUDA graph captures it too:
//   narrow_indices  i64 indices (torch.topk's type) narrowed: a value outside int32 becomes
//                   INT32_MIN, which the range check then reports as a bad index (and skips),
//                   never as the expert its low 32 bits would name;
//   route_slots     logical experts to live slots by src/all_to_all/slot_routing.hpp's rule, a
//                   thread per token, reading the table and the live ranks from device memory
//                   (a later mask reaches a captured graph); combine's weights with them.
#include "cuda/all_to_all/params.cuh"  // first: see there

#include <algorithm>
#include <climits>

#include "all_to_all/slot_routing.hpp"

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

template <typename Index>
__global__ void __launch_bounds__(kBlockThreads)
    route_slots(const Index* indices, int64_t tokens, int k, int rank,
                const ::pmoe::detail::SlotTableView table, int32_t* slots, const float* weights,
                float* weights_out) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < tokens; t += stride)
    ::pmoe::detail::route_row(table, indices + t * k, k, rank, t, slots + t * k,
                      weights ? weights + t * k : nullptr, weights ? weights_out + t * k : nullptr);
}

}  // namespace

void launch_route_slots(const void* indices, bool wide, int64_t tokens, int k, int rank,
                        const ::pmoe::detail::SlotTableView& table, int32_t* slots, const float* weights,
                        float* weights_out, cudaStream_t stream, int blocks) {
  if (tokens == 0) return;
  const int grid = int(std::min<int64_t>(blocks, (tokens + kBlockThreads - 1) / kBlockThreads));
  if (wide)
    launch("route_slots", route_slots<int64_t>, grid, stream,
           static_cast<const int64_t*>(indices), tokens, k, rank, table, slots, weights,
           weights_out);
  else
    launch("route_slots", route_slots<int32_t>, grid, stream,
           static_cast<const int32_t*>(indices), tokens, k, rank, table, slots, weights,
           weights_out);
}

void launch_narrow_indices(const int64_t* wide, int32_t* narrow, int64_t n, cudaStream_t stream,
                           int blocks) {
  if (n > 0) launch("narrow_indices", narrow_indices, blocks, stream, wide, narrow, n);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
