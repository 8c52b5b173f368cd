// The reduction of GemmReduceScatter on a device: one piece of a block, the partial products
// that arrived from peers (in the op's dtype) plus this rank's own (f32), summed in f32 in a
// fixed order and rounded once into `out` (a peer's next input, or C).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/flavor.hpp"
#include "pmoe/dtype.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

struct PieceSum {
  // Input i (i < count) is [rows, width] contiguous at inputs + ((first - i) mod world) *
  // input_stride elements: arrivals from ranks first, first - 1, ... in that order.
  const void* inputs = nullptr;
  int64_t input_stride = 0;
  int first = 0, count = 0, world = 1;
  const float* mine = nullptr;  // [rows, width], rows mine_ld apart: added last
  int64_t mine_ld = 0;
  void* out = nullptr;  // [rows, width], rows out_ld apart, in the dtype
  int64_t out_ld = 0;
  int64_t rows = 0, width = 0;
};

// out = round(inputs in order + mine), elements of `dtype` (f32, bf16 or f16), on `stream`.
void launch_piece_sum(const PieceSum& sum, DType dtype, int max_blocks, cudaStream_t stream);

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
