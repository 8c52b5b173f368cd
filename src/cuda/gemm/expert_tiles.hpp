// How a device layer's expert GEMMs tile their rows (src/cuda/moe/device_experts.hpp), as plain
// host arithmetic, so that the rule can be read and tested without a device: the tile size and
// the batch the host launches, and the rows the live tiles cover for given per-expert counts
// (what the plan kernel counts on the device, src/cuda/moe/moe_kernels.cuh PlanTiles).
//
// Each expert's rows are covered by ceil(count / T) tiles of T rows (the last one moved back to
// end at the count), so an expert in use costs a multiple of T rows, at least T. T is the largest
// power of two in [8, 128] (and <= C) with 32 E T <= expected, E the experts: padding every expert
// by up to T - 1 rows then costs at most 1/32 of the rows expected, which leaves room for routing
// far from uniform (Zipf 1.2 gives the coldest of 16 EP ranks about a quarter of the average:
// tests/cuda/test_cuda_moe_experts.cpp, MoeCudaTiles). 8 is the tensor cores' floor: the grouped
// GEMM's wmma fragment (m8n32k16) is 8 token rows, and on cuBLAS the token rows are the GEMM's N
// side, which Hopper's wgmma tiles in steps of 8. Smaller tiles waste fewer rows but read each
// expert's weights once a tile: only a GPU can say where that costs more.
//
// The batch: min(E ceil(C / T), ceil(max_rows / T) + E) tiles, a count the host knows without the
// counts. The grouped GEMM of bf16 layers computes the live tiles only (grouped_gemm.cuh); the
// cuBLAS batch of f32 layers computes all of them, the tiles past the live ones on scratch rows.
#pragma once

#include <algorithm>
#include <cstdint>

namespace pmoe::detail {

struct ExpertTiles {
  int tile = 0, tiles = 0;  // rows a tile, tiles in the batch
  int64_t rows() const { return int64_t(tile) * tiles; }  // rows the batch computes
};

inline constexpr int64_t kMinExpertTile = 8, kMaxExpertTile = 128;

// experts groups of C rows each, at most max_rows rows in use in all, about `expected`.
inline ExpertTiles plan_expert_tiles(int64_t experts, int64_t C, int64_t max_rows,
                                     int64_t expected) {
  if (C == 0 || experts == 0 || max_rows == 0) return {};
  int64_t tile = kMinExpertTile;
  while (tile < kMaxExpertTile && 32 * experts * (2 * tile) <= expected) tile *= 2;
  tile = std::min(tile, C);
  const int64_t tiles =
      std::min(experts * ((C + tile - 1) / tile), (max_rows + tile - 1) / tile + experts);
  return {int(tile), int(tiles)};
}

// The rows the live tiles of `tile` rows cover over experts with these row counts.
inline int64_t live_tile_rows(const int32_t* counts, int64_t experts, int64_t tile) {
  int64_t rows = 0;
  for (int64_t e = 0; e < experts; ++e) rows += (counts[e] + tile - 1) / tile * tile;
  return rows;
}

}  // namespace pmoe::detail
