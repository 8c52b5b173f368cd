// A rank's experts on a device. Their input rows sit in fixed-capacity groups, one per expert
// (what dispatch and the local grouping produce), with the row counts on the device only. The
// GEMMs run over the counts without the host reading them: a one-block kernel plans tiles of T
// rows over each group's rows in use (moe_kernels.cuh, PlanTiles), and each GEMM runs over those
// tiles, on the engines of the GEMM room (src/cuda/gemm/expert_gemm.hpp), which picks them. D is
// the layer's dtype:
//
//   x       [count, C, x_ld] D       expert e's rows at x + e C x_ld (rows past its count: garbage)
//   W1      [count, H, g F'] D       g = 2 for swiglu (gate | linear), F' this object's slice
//   hidden  [count, C, g F'] f32     = x . W1 over the tiles, f32 accumulation
//   act     [count, C, F'] D         = act(hidden), rounded to D (f32: in place in hidden)
//   W2      [count, F', O] D
//   out     [count, C, O] f32        = act . W2 over the same tiles
//
// bf16 (and f16) layers: a library's grouped GEMM (CUTLASS on a GPU, its shim on the emulated
// device), one GEMM an expert, wherever the library serves the GEMM; elsewhere pmoe's own grouped
// GEMM on tensor cores, which computes the live tiles only. Each of the two GEMMs is decided on
// its own, per call. f32 layers: cuBLAS's batch over a batch of tiles the host knows from a bound
// on the rows (at most ceil(max_rows / T) + count), in f32 or on TF32 tensor cores
// (MoeConfig::tf32); tiles past the live ones compute scratch rows there, since cuBLAS has no
// batch whose size the device sets (CUDA 13.0). This object plans the tiles and the activation
// between the GEMMs; expert_gemm.hpp says which engine takes which GEMM and why. The tile size
// follows src/cuda/gemm/expert_tiles.hpp (8 <= T <= 128, sized so padding each expert to whole
// tiles stays small against the rows expected).
//
// The weights are the CPU Experts' values (bf16 values are exact in bf16), so the products match
// the CPU backend's up to summation order, plus, for bf16, the rounding of act to bf16 that the
// second tensor-core GEMM needs (the CPU keeps it in f32), and for TF32 the inputs' rounding.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <initializer_list>
#include <iterator>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/flavor.hpp"
#include "cuda/gemm/expert_gemm.hpp"
#include "cuda/gemm/expert_tiles.hpp"
#include "cuda/moe/moe_kernels.cuh"
#include "moe/weights.hpp"
#include "pmoe/dtype.hpp"
#include "pmoe/moe.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

class DeviceExperts {
 public:
  // Local expert i is expert experts[i] (a range, or an EpMoe rank's slots under a placement),
  // hidden columns [ffn_begin, ffn_end), on `device`, for calls with up to rows_bound rows in
  // use; `runs` calls a forward (micro-batches) whose rows in use are tallied with
  // config.device_stats.
  DeviceExperts(const MoeConfig& config, const std::vector<int>& experts, int ffn_begin,
                int ffn_end, int64_t rows_bound, Device device, int runs = 1)
      : config_(config),
        count_(int(experts.size())),
        width_(ffn_end - ffn_begin),
        halves_(config.w1_halves()),
        runs_(runs),
        gemms_(config.dtype, config.tf32, count_, device) {
    const int H = config.hidden_dim, O = config.out_dim(), ld1 = halves_ * width_;
    const int count = count_;
    std::vector<float> w1(size_t(count) * H * ld1), w2(size_t(count) * width_ * O);
    for (int local = 0; local < count; ++local) {
      const int e = experts[size_t(local)];
      float* a = w1.data() + size_t(local) * H * ld1;
      detail::fill_weights(config, MoeTensor::w1, e, 0, H, ffn_begin, ffn_end, a, ld1);
      if (halves_ == 2)
        detail::fill_weights(config, MoeTensor::w1_linear, e, 0, H, ffn_begin, ffn_end,
                             a + width_, ld1);
      detail::fill_weights(config, MoeTensor::w2, e, ffn_begin, ffn_end, 0, O,
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
    batch_rows_.assign(size_t(runs), 0);
    engines_.assign(size_t(runs), gemms_.tile_choice());
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
  bool grouped() const { return gemms_.tile_engine() == ExpertGemmEngine::pmoe_wmma; }
  int width() const { return width_; }
  int hidden_ld() const { return halves_ * width_; }
  size_t weight_bytes() const { return w1_.nbytes() + w2_.nbytes(); }
  size_t workspace_bytes() const {
    return first_tile_.nbytes() + tile_pointers_.nbytes() + dead_hidden_.nbytes() +
           dead_act_.nbytes() + dead_out_.nbytes() + gemms_.workspace_bytes();
  }
  double flops(int64_t rows) const {
    return 2.0 * double(rows) * width_ *
           (double(halves_) * config_.hidden_dim + config_.out_dim());
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
    const int H = config_.hidden_dim, O = config_.out_dim(), ld1 = hidden_ld();
    const int64_t elem = int64_t(dtype_size(config_.dtype));
    const int act_ld = separate_act() ? width_ : ld1;
    if (!separate_act()) act = hidden;
    const void* const dead_act = separate_act() ? dead_act_.data<void>() : dead_hidden_.data<void>();
    int64_t* tally = tally_device_ ? tally_device_ + tally_words() * run : nullptr;
    // The GEMMs' operands, group g's at the step after group g - 1's (the library reads them;
    // their alignment decides whether it may).
    const int64_t out_elem = int64_t(sizeof(float)), act_elem = separate_act() ? elem : out_elem;
    LibraryOperands operands[ExpertGemmChoice::kGemms];
    LibraryOperands &first = operands[0], &second = operands[1];
    first.a = x, first.lda = x_ld, first.a_step = C * x_ld * elem;
    first.b = w1_.data<void>(), first.ldb = ld1, first.b_step = int64_t(H) * ld1 * elem;
    first.d = hidden, first.ldd = ld1, first.d_step = C * ld1 * out_elem;
    first.n = ld1, first.k = H;
    second.a = act, second.lda = act_ld, second.a_step = C * act_ld * act_elem;
    second.b = w2_.data<void>(), second.ldb = O, second.b_step = int64_t(width_) * O * elem;
    second.d = out, second.ldd = O, second.d_step = C * O * out_elem;
    second.n = O, second.k = width_;
    const ExpertGemmChoice choice = gemms_.choose(operands);
    engines_[size_t(run)] = choice;
    if (choice.tiles()) {
      PlanTiles p;
      p.counts = counts;
      p.groups = count_;
      p.tile = plan.tile;
      p.max_tiles = plan.tiles;
      p.group_rows = C;
      p.first_tile = first_tile_.data<int32_t>();
      const TileOperand tile_operands[PlanTiles::kOperands] = {
          {x, x_ld * elem, false, x, tiles(kX)},
          {w1_.data<void>(), int64_t(H) * ld1 * elem, true, w1_.data<void>(), tiles(kW1)},
          {hidden, ld1 * out_elem, false, dead_hidden_.data<void>(), tiles(kHidden)},
          {act, act_ld * act_elem, false, dead_act, tiles(kAct)},
          {w2_.data<void>(), int64_t(width_) * O * elem, true, w2_.data<void>(), tiles(kW2)},
          {out, O * out_elem, false, dead_out_.data<void>(), tiles(kOut)}};
      std::copy(std::begin(tile_operands), std::end(tile_operands), p.operands);
      p.tally = tally;
      launch_plan_tiles(p, stream);
    }
    // The tile plan counts the rows in use where it runs.
    gemms_.plan_groups(choice, operands, counts, C, tally, choice.tiles() ? -1 : 0, kLibraryRows,
                        stream);
    batch_rows_[size_t(run)] = plan.rows();
    // GEMM i: D [rows, n] = A [rows, k] . B [k, n] over the groups (the library), or over the
    // plan's tiles (pmoe's kernel: the live ones; cuBLAS: the whole batch).
    auto gemm = [&](int i, Operand a, Operand b, Operand d, int64_t* issued) {
      ExpertGemm g;
      g.groups = operands[i];
      g.a_tiles = tiles(a);
      g.b_tiles = tiles(b);
      g.d_tiles = outputs(d);
      g.tile_rows = plan.tile;
      g.max_tiles = plan.tiles;
      g.live_tiles = first_tile_.data<int32_t>() + count_;
      g.issued = issued;
      gemms_.run(choice, i, g, handle, stream);
    };
    gemm(0, kX, kW1, kHidden, tally ? tally + kOwnIssued : nullptr);
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
    gemm(1, kAct, kW2, kOut, tally ? tally + kOwnIssued + blocks() : nullptr);
  }

  // The kernels the last call's GEMMs took (run `run`), for reports: the library's grouped GEMM,
  // pmoe's own, or cuBLAS's batch; "x.W1: a, act.W2: b" where the two differ. Decided on the
  // host before the call's kernels were enqueued, so no wait.
  std::string gemm_path(int run = 0) const {
    auto name = [&](int i) -> std::string { return gemms_.name(engines_[size_t(run)].engine[i]); };
    const std::string first = name(0), second = name(1);
    return first == second ? first : "x.W1: " + first + ", act.W2: " + second;
  }

  // With device stats, over the last forward's runs (the first `runs`): the rows in use and the
  // live tiles' rows, as the plan kernels counted them, and the rows the GEMMs issued (the more
  // of the two GEMMs'): on pmoe's grouped GEMM, what its blocks computed; on the library, its
  // tiles' rows, 128 ceil(m / 128) an expert (PlanGroups counts them: the library does not);
  // on cuBLAS the batch launched. Where both GEMMs take the library, no tile plan runs and the
  // live rows are the library's tiles' rows. The caller has waited for them.
  struct RowTally {
    int64_t used = 0, live = 0, issued = 0;
  };
  RowTally tally(int runs) const {
    RowTally t;
    for (int r = 0; tally_ && r < std::min(runs, runs_); ++r) {
      const int64_t* words = tally_ + tally_words() * r;
      const ExpertGemmChoice& choice = engines_[size_t(r)];
      t.used += words[0];
      t.live += choice.tiles() ? words[1] : words[kLibraryRows];
      if (!grouped()) {
        t.issued += batch_rows_[size_t(r)];
        continue;
      }
      int64_t issued[2] = {0, 0};
      for (int i = 0; i < 2; ++i) {
        if (choice.library(i)) {
          issued[i] = words[kLibraryRows];
          continue;
        }
        for (int b = 0; b < blocks(); ++b) issued[i] += words[kOwnIssued + i * blocks() + b];
      }
      t.issued += std::max(issued[0], issued[1]);
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
  // A run's tally: rows used, live rows (the tile plan's), the library's tiles' rows, then with
  // pmoe's grouped GEMM each block's rows issued by the first GEMM and by the second.
  static constexpr int kLibraryRows = 2, kOwnIssued = 3;
  int64_t tally_words() const { return kOwnIssued + 2 * int64_t(blocks()); }
  int blocks() const { return gemms_.blocks(); }  // pmoe's kernel's grid (0: cuBLAS)
  enum Operand { kX, kW1, kHidden, kAct, kW2, kOut };  // PlanTiles::operands' order
  int64_t* slots(Operand o) const { return tile_pointers_.data<int64_t>() + int64_t(o) * max_tiles_; }
  const void** tiles(Operand o) const { return reinterpret_cast<const void**>(slots(o)); }

  void* const* outputs(Operand o) const { return reinterpret_cast<void* const*>(slots(o)); }

  MoeConfig config_;
  int count_, width_, halves_, runs_;
  ExpertGemms gemms_;  // the engines, and which takes which GEMM
  mutable std::vector<int64_t> batch_rows_;  // per run: the rows the host's batch covers (cuBLAS issues)
  mutable std::vector<ExpertGemmChoice> engines_;  // per run: which engines the last call took
  Buffer w1_, w2_;
  int64_t max_tiles_ = 0;
  Buffer first_tile_, tile_pointers_, dead_hidden_, dead_act_, dead_out_;  // the plan's
  int64_t* tally_ = nullptr;  // host-mapped [runs][tally_words()] (device stats)
  int64_t* tally_device_ = nullptr;  // the same words, as the plan kernel addresses them
};

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
