// pmoe's grouped GEMM for the experts of a bf16 (or f16) layer on a device: tensor cores
// (nvcuda::wmma, 16-bit inputs, f32 accumulation) over the live tiles of a tile plan
// (src/cuda/moe/moe_kernels.cuh, PlanTiles), a count the kernel reads from device memory. The
// host launches a grid of fixed size; the blocks take the live tiles' work in turn and stop
// there, so the rows computed follow the device's counts, with no host round trip and no scratch
// tiles (cuBLAS has no batch whose size the device sets: docs/gpu.md).
//
//   a[t]   tile t's first row of A: T rows of k elements, row stride lda (16-bit)
//   b[t]   tile t's B [k, n], row stride ldb (16-bit): its expert's weights
//   c[t]   tile t's first row of C: T rows of n f32, row stride ldc; C = A . B (overwritten)
//   t < min(*live_tiles, max_tiles); the arrays' entries past that are not read
//
// A tile's rows run as wmma fragments of 8 rows (m8n32k16): a tile of T rows costs 8 ceil(T / 8)
// rows of tensor-core work, so 8 rows is the floor at decode shapes.
//
// With device stats, `issued` [gridDim] gets each block's rows computed: 8 ceil(T / 8) for each
// tile whose first column block it ran. Their sum is the rows this GEMM issued (MoeStats::expert_rows).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/flavor.hpp"
#include "pmoe/dtype.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

struct GroupedGemm {
  const void* const* a = nullptr;
  const void* const* b = nullptr;
  void* const* c = nullptr;
  const int32_t* live_tiles = nullptr;  // device
  int max_tiles = 0, tile_rows = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;  // elements
  int64_t* issued = nullptr;          // [blocks] (host-mapped), or null: not counted
};

// `blocks` blocks (a grid the host fixes: the device's multiprocessors times kBlocksPerSm)
// computing C for each live tile; `inputs` bf16 or f16 (else a pmoe::Error).
void launch_grouped_gemm(const GroupedGemm& g, DType inputs, int blocks, cudaStream_t stream);

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
