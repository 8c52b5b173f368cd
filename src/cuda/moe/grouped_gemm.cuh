// pmoe's grouped GEMM for the experts of a bf16 (or f16) layer on a device: tensor cores
// (nvcuda::wmma, 16-bit inputs, f32 accumulation) over the live tiles of a tile plan
// (moe_kernels.cuh, PlanTiles), a count the kernel reads from device memory. The host launches
// a grid of fixed size; the blocks take the live tiles' work in turn and stop there, so the rows
// computed follow the device's counts, with no host round trip and no scratch tiles (cuBLAS has
// no batch whose size the device sets: docs/gpu.md).
//
//   a[t]   tile t's first row of A: T rows of k elements, row stride lda (16-bit)
//   b[t]   tile t's B [k, n], row stride ldb (16-bit): its expert's weights
//   c[t]   tile t's first row of C: T rows of n f32, row stride ldc; C = A . B (overwritten)
//   t < min(*live_tiles, max_tiles); the arrays' entries past that are not read
//
// With device stats, `issued` [gridDim] gets each block's rows computed: T for each tile whose
// first column block it ran. Their sum is the rows this GEMM issued (MoeStats::expert_rows).
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

// The block tile: T rows (rounded up to 8, the fragment's rows) by grouped_gemm_columns(T, n)
// columns (at most n rounded up to 32), sized so that each of the block's 8 warps has a
// fragment when T is small.
int grouped_gemm_columns(int tile_rows, int n);
// The rows of one tile the tensor cores compute (T rounded up to 8): the decode floor.
int grouped_gemm_floor_rows(int tile_rows);

// `blocks` blocks (a grid the host fixes: the device's multiprocessors times kBlocksPerSm)
// computing C for each live tile; `inputs` bf16 or f16 (else a pmoe::Error).
void launch_grouped_gemm(const GroupedGemm& g, DType inputs, int blocks, cudaStream_t stream);

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
