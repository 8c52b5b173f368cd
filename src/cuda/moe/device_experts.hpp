// A rank's experts on a device. Their input rows sit in fixed-capacity groups, one per expert
// (what dispatch and the local grouping produce), with the row counts on the device only. The
// GEMMs run over the counts without the host reading them: a one-block kernel plans tiles of T
// rows over each group's rows in use (moe_kernels.cuh, PlanTiles), and each GEMM is one
// cublasGemmBatchedEx over a number of tiles the host knows from a bound on the rows:
//
//   x       [count, C, H] f32         expert e's rows at x + e C H (rows past its count: garbage)
//   W1      [count, H, g F'] f32      g = 2 for swiglu (gate | linear), F' this object's slice
//   hidden  [count, C, g F'] f32      = x . W1 over the tiles
//   W2      [count, F', O] f32
//   out     [count, C, O] f32         = act(hidden) . W2 over the same tiles
//
// T is the least power of two in [16, 128] at or above the rows an expert has on average (at most
// C), and the batch is min(count ceil(C / T), ceil(max_rows / T) + count) tiles, so a call
// computes at most max_rows + count T rows, where a batch over every slot computed count C.
// Tiles past the live ones compute scratch rows. The weights are the CPU Experts' values (f32,
// bf16 values kept in f32 for a bf16 model), so the products match the CPU backend's up to
// summation order inside the GEMMs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/flavor.hpp"
#include "cuda/moe/batched_gemm.hpp"
#include "cuda/moe/moe_kernels.cuh"
#include "moe/weights.hpp"
#include "pmoe/moe.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

class DeviceExperts {
 public:
  // Experts [first, first + count), hidden columns [ffn_begin, ffn_end), on `device`, for calls
  // with up to rows_bound rows in use.
  DeviceExperts(const MoeConfig& config, int first, int count, int ffn_begin, int ffn_end,
                int64_t rows_bound, Device device)
      : config_(config), count_(count), width_(ffn_end - ffn_begin), halves_(config.w1_halves()) {
    const int H = config.feature_dim, O = config.out_dim(), ld1 = halves_ * width_;
    std::vector<float> w1(size_t(count) * H * ld1), w2(size_t(count) * width_ * O);
    for (int local = 0; local < count; ++local) {
      float* a = w1.data() + size_t(local) * H * ld1;
      detail::fill_weights(config, MoeTensor::w1, first + local, 0, H, ffn_begin, ffn_end, a, ld1);
      if (halves_ == 2)
        detail::fill_weights(config, MoeTensor::w1_linear, first + local, 0, H, ffn_begin, ffn_end,
                             a + width_, ld1);
      detail::fill_weights(config, MoeTensor::w2, first + local, ffn_begin, ffn_end, 0, O,
                           w2.data() + size_t(local) * width_ * O, O);
    }
    w1_ = Buffer(DType::f32, {count, H, ld1}, device);
    w2_ = Buffer(DType::f32, {count, width_, O}, device);
    copy(w1_, Tensor(w1.data(), DType::f32, {count, H, ld1}));
    copy(w2_, Tensor(w2.data(), DType::f32, {count, width_, O}));
    // Whatever C and max_rows a call brings (max_rows <= rows_bound), its batch is at most this
    // (tile_plan: T < 128 only where max_rows / count <= T or T = C).
    max_tiles_ = 2 * int64_t(count) + (rows_bound + kMaxTile - 1) / kMaxTile;
    first_tile_ = Buffer(DType::i32, {count + 1}, device);
    tile_pointers_ = Buffer(DType::i64, {5, max_tiles_}, device);
    dead_hidden_ = Buffer(DType::f32, {kMaxTile, ld1}, device);
    dead_out_ = Buffer(DType::f32, {kMaxTile, O}, device);
  }

  // The tiles of a call over groups of C rows with at most max_rows rows in use in all.
  struct TilePlan {
    int tile = 0, tiles = 0;
    int64_t rows() const { return int64_t(tile) * tiles; }  // rows the GEMMs compute
  };
  TilePlan tile_plan(int64_t C, int64_t max_rows) const {
    if (C == 0 || count_ == 0 || max_rows == 0) return {};
    const int64_t per_expert = (max_rows + count_ - 1) / count_;
    int64_t tile = kMinTile;
    while (tile < per_expert && tile < kMaxTile) tile *= 2;
    tile = std::min(tile, C);
    const int64_t tiles =
        std::min(count_ * ((C + tile - 1) / tile), (max_rows + tile - 1) / tile + count_);
    return {int(tile), int(tiles)};
  }

  int hidden_ld() const { return halves_ * width_; }
  size_t weight_bytes() const { return w1_.nbytes() + w2_.nbytes(); }
  size_t workspace_bytes() const {
    return first_tile_.nbytes() + tile_pointers_.nbytes() + dead_hidden_.nbytes() +
           dead_out_.nbytes();
  }
  double flops(int64_t rows) const {
    return 2.0 * double(rows) * width_ *
           (double(halves_) * config_.feature_dim + config_.out_dim());
  }

  // out = act(x . W1) . W2 over the rows in use of every expert's group of C rows, `counts`
  // (device, [count]) of them, at most max_rows in all (a bound the host knows).
  void run(cublasHandle_t handle, cudaStream_t stream, int C, int64_t max_rows, const float* x,
           float* hidden, float* out, const int32_t* counts) const {
    const TilePlan plan = tile_plan(C, max_rows);
    if (plan.tiles == 0) return;
    PMOE_CHECK(plan.tiles <= max_tiles_, "DeviceExperts: ", plan.tiles, " tiles for ", max_rows,
               " rows, more than the ", max_tiles_, " planned for");
    const int H = config_.feature_dim, O = config_.out_dim(), ld1 = hidden_ld();
    auto pointers = [&](int i) { return tile_pointers_.data<int64_t>() + int64_t(i) * max_tiles_; };
    PlanTiles p;
    p.counts = counts;
    p.groups = count_;
    p.tile = plan.tile;
    p.max_tiles = plan.tiles;
    p.group_rows = C;
    p.first_tile = first_tile_.data<int32_t>();
    p.x = x;
    p.x_ld = H;
    p.w1 = w1_.data<float>();
    p.w1_stride = int64_t(H) * ld1;
    p.hidden = hidden;
    p.hidden_ld = ld1;
    p.w2 = w2_.data<float>();
    p.w2_stride = int64_t(width_) * O;
    p.out = out;
    p.out_ld = O;
    p.dead_hidden = dead_hidden_.data<float>();
    p.dead_out = dead_out_.data<float>();
    p.x_tiles = reinterpret_cast<const float**>(pointers(0));
    p.w1_tiles = reinterpret_cast<const float**>(pointers(1));
    p.hidden_tiles = reinterpret_cast<float**>(pointers(2));
    p.w2_tiles = reinterpret_cast<const float**>(pointers(3));
    p.out_tiles = reinterpret_cast<float**>(pointers(4));
    launch_plan_tiles(p, stream);
    gemm_arrays_row_major(handle, plan.tile, ld1, H, p.x_tiles, H, p.w1_tiles, ld1, p.hidden_tiles,
                          ld1, plan.tiles);
    Activate a;
    a.hidden = hidden;
    a.rows = int64_t(count_) * C;
    a.width = width_;
    a.act = int(config_.act);
    a.row_limits = counts;
    a.group_rows = C;
    launch_activate(a, stream);
    gemm_arrays_row_major(handle, plan.tile, O, width_, p.hidden_tiles, ld1, p.w2_tiles, O,
                          p.out_tiles, O, plan.tiles);
  }

 private:
  static constexpr int64_t kMinTile = 16, kMaxTile = 128;

  MoeConfig config_;
  int count_, width_, halves_;
  Buffer w1_, w2_;
  int64_t max_tiles_ = 0;
  Buffer first_tile_, tile_pointers_, dead_hidden_, dead_out_;  // the plan's (PlanTiles)
};

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
