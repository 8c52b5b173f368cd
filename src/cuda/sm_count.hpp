// The streaming multiprocessors of a CUDA device (on the emulated device, the count it was given,
// PMOE_EMU_SMS): what pmoe sizes its grids (launch.cuh's grid_blocks) and the GEMM library's
// workspaces from. The one place that asks the runtime.
#pragma once

#include "cuda/check.hpp"
#include "cuda/flavor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

inline int sm_count(int device) {
  int sms = 0;
  PMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
