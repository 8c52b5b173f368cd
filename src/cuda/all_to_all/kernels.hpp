// Host-side launchers of AllToAll's kernels (dispatch.cu, combine.cu). None synchronises the
// host, so a CUDA graph can capture them.
#pragma once

#include <cuda_runtime.h>

#include "all_to_all/slot_routing.hpp"
#include "cuda/all_to_all/params.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

// With p.fuse_recv the send kernel also waits for the peers (its last block), and the receive
// launched next must be told so (`waited`): it then launches only its grid kernel.
void launch_dispatch_send(const AllToAllParams& p, cudaStream_t stream, int blocks);
void launch_dispatch_recv(const AllToAllParams& p, cudaStream_t stream, int blocks, bool waited);
void launch_combine_send(const AllToAllParams& p, cudaStream_t stream, int blocks);
void launch_combine_recv(const AllToAllParams& p, cudaStream_t stream, int blocks, bool waited);
// narrow[i] = wide[i] for the n indices, INT32_MIN where a value does not fit (narrow_indices.cu).
void launch_narrow_indices(const int64_t* wide, int32_t* narrow, int64_t n, cudaStream_t stream,
                           int blocks);
// slots[t, j] = the live slot of indices[t, j] (i64 when `wide`, else i32) for the `tokens` rows,
// by src/all_to_all/slot_routing.hpp's rule over `table` (device memory); with weights (combine),
// weights_out as combine must use them (narrow_indices.cu).
void launch_route_slots(const void* indices, bool wide, int64_t tokens, int k, int rank,
                        const ::pmoe::detail::SlotTableView& table, int32_t* slots, const float* weights,
                        float* weights_out, cudaStream_t stream, int blocks);

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
