// The overlap ops' alternative to copy-engine pulls: a copy kernel on a bounded number of blocks
// (PMOE_OVERLAP_COPY=kernel; overlap_stream.hpp). Which is faster beside a tensor-core GEMM only
// a GPU can say; the copy engines are the default.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/flavor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

constexpr int kCopyBlocks = 8;  // blocks (so SMs at most) a copy kernel takes from the GEMMs

// bytes from src (a peer's symmetric memory, or local) to dst, on `stream`, by kCopyBlocks
// blocks: 16-byte words where both ends allow, single bytes at the edges.
void copy_with_kernel(void* dst, const void* src, size_t bytes, cudaStream_t stream);

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
