// The entry points of the CUTLASS grouped GEMMs (nvcc only), one translation unit each, built
// for their architecture alone where CMake found CUTLASS's headers (PMOE_HAVE_CUTLASS):
// grouped_gemm_sm90.cu (sm_90a) and grouped_gemm_sm80.cu (sm_80). library_grouped_gemm_gpu.cu
// picks one per device. Each takes the arrays of library_grouped_gemm.cuh as they are: its
// file checks once, on the host, that CUTLASS's own types have that layout.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/gemm/library_grouped_gemm.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace cutlass_sm90 {
size_t workspace_bytes(int groups, int device);
void run(const LibraryGroupedGemm& g, cudaStream_t stream);  // throws pmoe::Error
}  // namespace cutlass_sm90
namespace cutlass_sm80 {
size_t workspace_bytes(int groups, int device);
void run(const LibraryGroupedGemm& g, cudaStream_t stream);
}  // namespace cutlass_sm80
}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
