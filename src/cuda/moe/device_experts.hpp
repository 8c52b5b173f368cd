// A rank's experts on a device. Their input rows sit in fixed-capacity groups, one per expert
// (what dispatch and the local grouping produce), with the row counts on the device only. The
// GEMMs run over the counts without the host reading them: a one-block kernel plans tiles of T
// rows over each group's rows in use (moe_kernels.cuh, PlanTiles), and each GEMM runs over those
// tiles. D is the layer's dtype:
//
//   x       [count, C, x_ld] D       expert e's rows at x + e C x_ld (rows past its count: garbage)
//   W1      [count, H, g F'] D       g = 2 for swiglu (gate | linear), F' this object's slice
//   hidden  [count, C, g F'] f32     = x . W1 over the tiles, f32 accumulation
//   act     [count, C, F'] D         = act(hidden), rounded to D (f32: in place in hidden)
//   W2      [count, F', O] D
//   out     [count, C, O] f32        = act . W2 over the same tiles
//
// bf16 (and f16) layers: pmoe's grouped GEMM on tensor cores (grouped_gemm.cuh), which reads the
// plan's live tile count on the device and computes those tiles only. f32 layers: one
// cublasGemmBatchedEx over a batch of tiles the host knows from a bound on the rows (at most
// ceil(max_rows / T) + count), in f32 or on TF32 tensor cores (MoeConfig::tf32); tiles past the
// live ones compute scratch rows there, since cuBLAS has no batch whose size the device sets
// (CUDA 13.0). The tile size follows expert_tiles.hpp (8 <= T <= 128, sized so padding each
// expert to whole tiles stays small against the rows expected).
//
// The weights are the CPU Experts' values (bf16 values are exact in bf16), so the products match
// the CPU backend's up to summation order, plus, for bf16, the rounding of act to bf16 that the
// second tensor-core GEMM needs (the CPU keeps it in f32), and for TF32 the inputs' rounding.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/flavor.hpp"
#include "cuda/moe/batched_gemm.hpp"
#include "cuda/moe/expert_tiles.hpp"
#include "cuda/moe/grouped_gemm.cuh"
#include "cuda/launch.cuh"
#include "cuda/moe/moe_kernels.cuh"
#include "moe/weights.hpp"
#include "pmoe/dtype.hpp"
#include "pmoe/moe.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

class DeviceExperts {
 public:
  // Experts [first, first + count), hidden columns [ffn_begin, ffn_end), on `device`, for calls
  // with up to rows_bound rows in use; `runs` calls a forward (micro-batches) whose rows in use
  // are tallied with config.device_stats.
  DeviceExperts(const MoeConfig& config, int first, int count, int ffn_begin, int ffn_end,
                int64_t rows_bound, Device device, int runs = 1)
      : config_(config),
        types_{config.dtype, config.tf32},
        count_(count),
        width_(ffn_end - ffn_begin),
        halves_(config.w1_halves()),
        runs_(runs) {
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
    w1_ = upload(w1, {count, H, ld1}, device);
    w2_ = upload(w2, {count, width_, O}, device);
    // Whatever C and max_rows a call brings (max_rows <= rows_bound), its batch is at most this.
    max_tiles_ = int64_t(count) + (rows_bound + detail::kMinExpertTile - 1) / detail::kMinExpertTile;
    first_tile_ = Buffer(DType::i32, {count + 1}, device);
    tile_pointers_ = Buffer(DType::i64, {PlanTiles::kOperands, max_tiles_}, device);
    dead_hidden_ = Buffer(DType::f32, {kMaxTile, ld1}, device);
    if (separate_act()) dead_act_ = Buffer(config.dtype, {kMaxTile, width_}, device);
    dead_out_ = Buffer(DType::f32, {kMaxTile, O}, device);
    if (grouped()) {
      int sms = 0;
      PMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device.index));
      blocks_ = grid_blocks(sms);
    }
    batch_rows_.assign(size_t(runs), 0);
    if (config.device_stats) {
      PMOE_CUDA_CHECK(cudaHostAlloc(&tally_, sizeof(int64_t) * tally_words() * size_t(runs),
                                    cudaHostAllocMapped));
      PMOE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&tally_device_), tally_, 0));
    }
  }
  ~DeviceExperts() {
    if (tally_) (void)cudaFreeHost(tally_);
  }
  DeviceExperts(const DeviceExperts&) = delete;
  DeviceExperts& operator=(const DeviceExperts&) = delete;

  // The tiles of a call over groups of C rows with at most max_rows rows in use in all, and
  // about `expected` in use (expert_tiles.hpp).
  using TilePlan = detail::ExpertTiles;
  TilePlan tile_plan(int64_t C, int64_t max_rows, int64_t expected) const {
    return detail::plan_expert_tiles(count_, C, max_rows, expected);
  }

  // The second GEMM's input (act) has its own buffer, [count, C, width] of the layer's dtype,
  // unless the layer is f32 (then it is the hidden buffer, in place).
  bool separate_act() const { return config_.dtype != DType::f32; }
  // The GEMMs run as pmoe's grouped GEMM on tensor cores (16-bit layers), not cuBLAS's batch.
  bool grouped() const { return config_.dtype != DType::f32; }
  int width() const { return width_; }
  int hidden_ld() const { return halves_ * width_; }
  size_t weight_bytes() const { return w1_.nbytes() + w2_.nbytes(); }
  size_t workspace_bytes() const {
    return first_tile_.nbytes() + tile_pointers_.nbytes() + dead_hidden_.nbytes() +
           dead_act_.nbytes() + dead_out_.nbytes();
  }
  double flops(int64_t rows) const {
    return 2.0 * double(rows) * width_ *
           (double(halves_) * config_.feature_dim + config_.out_dim());
  }

  // out = act(x . W1) . W2 over the rows in use of every expert's group of C rows, `counts`
  // (device, [count]) of them, at most max_rows in all (a bound the host knows), about
  // `expected`. x [count, C, x_ld] of the layer's dtype; act [count, C, width()] of the layer's
  // dtype where separate_act(), else ignored. `run` (< runs) is the tally slot of this call.
  void run(cublasHandle_t handle, cudaStream_t stream, int C, int64_t max_rows, int64_t expected,
           const void* x, int x_ld, float* hidden, void* act, float* out, const int32_t* counts,
           int run = 0) const {
    const TilePlan plan = tile_plan(C, max_rows, expected);
    if (plan.tiles == 0) return;
    PMOE_CHECK(plan.tiles <= max_tiles_ && run < runs_, "DeviceExperts: ", plan.tiles,
               " tiles for ", max_rows, " rows (run ", run, "), more than the ", max_tiles_,
               " tiles and ", runs_, " runs planned for");
    const int H = config_.feature_dim, O = config_.out_dim(), ld1 = hidden_ld();
    const int64_t elem = int64_t(dtype_size(config_.dtype));
    const int act_ld = separate_act() ? width_ : ld1;
    if (!separate_act()) act = hidden;
    const void* const dead_act = separate_act() ? dead_act_.data<void>() : dead_hidden_.data<void>();
    PlanTiles p;
    p.counts = counts;
    p.groups = count_;
    p.tile = plan.tile;
    p.max_tiles = plan.tiles;
    p.group_rows = C;
    p.first_tile = first_tile_.data<int32_t>();
    const TileOperand operands[PlanTiles::kOperands] = {
        {x, x_ld * elem, false, x, tiles(kX)},
        {w1_.data<void>(), int64_t(H) * ld1 * elem, true, w1_.data<void>(), tiles(kW1)},
        {hidden, ld1 * int64_t(sizeof(float)), false, dead_hidden_.data<void>(), tiles(kHidden)},
        {act, act_ld * (separate_act() ? elem : int64_t(sizeof(float))), false, dead_act,
         tiles(kAct)},
        {w2_.data<void>(), int64_t(width_) * O * elem, true, w2_.data<void>(), tiles(kW2)},
        {out, O * int64_t(sizeof(float)), false, dead_out_.data<void>(), tiles(kOut)}};
    std::copy(std::begin(operands), std::end(operands), p.operands);
    int64_t* tally = tally_device_ ? tally_device_ + tally_words() * run : nullptr;
    p.tally = tally;
    launch_plan_tiles(p, stream);
    batch_rows_[size_t(run)] = plan.rows();
    // C [tile rows, n] = A [tile rows, k] . B [k, n] for every planned tile: the grouped GEMM
    // over the live tiles (16-bit layers), or cuBLAS over the whole batch (f32).
    auto gemm = [&](Operand a, int lda, Operand b, Operand c, int n, int k, int64_t* issued) {
      if (!grouped()) {
        gemm_arrays_row_major(handle, types_, plan.tile, n, k, tiles(a), lda, tiles(b), n,
                              outputs(c), n, plan.tiles);
        return;
      }
      GroupedGemm g;
      g.live_tiles = first_tile_.data<int32_t>() + count_;
      g.max_tiles = plan.tiles;
      g.tile_rows = plan.tile;
      g.a = tiles(a);
      g.b = tiles(b);
      g.c = outputs(c);
      g.n = n;
      g.k = k;
      g.lda = lda;
      g.ldb = n;
      g.ldc = n;
      g.issued = issued;
      launch_grouped_gemm(g, config_.dtype, blocks_, stream);
    };
    gemm(kX, x_ld, kW1, kHidden, ld1, H, tally ? tally + 2 : nullptr);
    Activate a;
    a.hidden = hidden;
    a.out = act;
    a.out_ld = act_ld;
    a.rows = int64_t(count_) * C;
    a.width = width_;
    a.act = int(config_.act);
    a.row_limits = counts;
    a.group_rows = C;
    launch_activate(a, config_.dtype, stream);
    gemm(kAct, act_ld, kW2, kOut, O, width_, tally ? tally + 2 + blocks_ : nullptr);
  }

  // With device stats, over the last forward's runs (the first `runs`): the rows in use and the
  // live tiles' rows, as the plan kernels counted them, and the rows the GEMMs issued: on the
  // grouped GEMM, what its blocks computed (the more of the two GEMMs'), on cuBLAS the batch
  // launched. The caller has waited for them.
  struct RowTally {
    int64_t used = 0, live = 0, issued = 0;
  };
  RowTally tally(int runs) const {
    RowTally t;
    for (int r = 0; tally_ && r < std::min(runs, runs_); ++r) {
      const int64_t* words = tally_ + tally_words() * r;
      t.used += words[0];
      t.live += words[1];
      if (!grouped()) {
        t.issued += batch_rows_[size_t(r)];
        continue;
      }
      int64_t first = 0, second = 0;
      for (int b = 0; b < blocks_; ++b) {
        first += words[2 + b];
        second += words[2 + blocks_ + b];
      }
      t.issued += std::max(first, second);
    }
    return t;
  }

 private:
  static constexpr int64_t kMaxTile = detail::kMaxExpertTile;
  // The weights in the layer's dtype on `device`: bf16 values are exact in bf16 (fill_weights
  // rounded them), so narrowing them here changes nothing.
  Buffer upload(const std::vector<float>& values, std::initializer_list<int64_t> shape,
                Device device) const {
    Buffer out(config_.dtype, shape, device);
    if (config_.dtype == DType::f32) {
      copy(out, Tensor(const_cast<float*>(values.data()), DType::f32, shape));
      return out;
    }
    std::vector<bf16> narrow(values.size());
    for (size_t i = 0; i < values.size(); ++i) narrow[i] = to_bf16(values[i]);
    copy(out, Tensor(narrow.data(), DType::bf16, shape));
    return out;
  }
  // A run's tally: rows used, live rows, then with the grouped GEMM each block's rows issued by
  // the first GEMM and by the second.
  int64_t tally_words() const { return 2 + 2 * int64_t(blocks_); }
  enum Operand { kX, kW1, kHidden, kAct, kW2, kOut };  // PlanTiles::operands' order
  int64_t* slots(Operand o) const { return tile_pointers_.data<int64_t>() + int64_t(o) * max_tiles_; }
  const void** tiles(Operand o) const { return reinterpret_cast<const void**>(slots(o)); }

  void* const* outputs(Operand o) const { return reinterpret_cast<void* const*>(slots(o)); }

  MoeConfig config_;
  ExpertGemmTypes types_;
  int count_, width_, halves_, runs_;
  int blocks_ = 0;                   // the grouped GEMM's grid (0: cuBLAS)
  mutable std::vector<int64_t> batch_rows_;  // per run: the rows the host's batch covers (cuBLAS issues)
  Buffer w1_, w2_;
  int64_t max_tiles_ = 0;
  Buffer first_tile_, tile_pointers_, dead_hidden_, dead_act_, dead_out_;  // the plan's
  int64_t* tally_ = nullptr;  // host-mapped [runs][tally_words()] (device stats)
  int64_t* tally_device_ = nullptr;  // the same words, as the plan kernel addresses them
};

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
