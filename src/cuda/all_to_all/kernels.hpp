// Host-side launchers of AllToAll's kernels (dispatch.cu, combine.cu). None synchronises the
// host, so a CUDA graph can capture them.
#pragma once

#include <cuda_runtime.h>

#include "cuda/all_to_all/params.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

void launch_dispatch_send(const AllToAllParams& p, cudaStream_t stream, int blocks);
void launch_dispatch_recv(const AllToAllParams& p, cudaStream_t stream, int blocks);
void launch_combine_send(const AllToAllParams& p, cudaStream_t stream, int blocks);
void launch_combine_recv(const AllToAllParams& p, cudaStream_t stream, int blocks);

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
