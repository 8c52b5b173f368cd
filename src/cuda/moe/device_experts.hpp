// A rank's experts on a device, run as batched GEMMs over fixed-capacity groups of rows so that
// no row count is read on the host:
//
//   x       [count, C, H] f32         expert e's rows at x + e C H (rows past its count: garbage)
//   W1      [count, H, g F'] f32      g = 2 for swiglu (gate | linear), F' this object's slice
//   hidden  [count, C, g F'] f32      = x . W1, one cublasGemmStridedBatchedEx
//   W2      [count, F', O] f32
//   out     [count, C, O] f32         = act(hidden) . W2, a second one
//
// Every slot of every group is multiplied: a call costs count * C rows of FLOPs whatever the
// counts (docs/gpu.md says what that costs); the activation skips rows past the counts. The
// weights are the CPU Experts' values (f32, bf16 values kept in f32 for a bf16 model), so the
// products match the CPU backend's up to summation order inside the GEMMs.
#pragma once

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
  // Experts [first, first + count), hidden columns [ffn_begin, ffn_end), on `device`.
  DeviceExperts(const MoeConfig& config, int first, int count, int ffn_begin, int ffn_end,
                Device device)
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
  }

  int hidden_ld() const { return halves_ * width_; }
  size_t weight_bytes() const { return w1_.nbytes() + w2_.nbytes(); }
  double flops(int64_t rows) const {
    return 2.0 * double(rows) * width_ *
           (double(halves_) * config_.feature_dim + config_.out_dim());
  }

  // out = act(x . W1) . W2 for every expert's C slots; `counts` (device, [count]) bounds the
  // activation's rows (null: every row).
  void run(cublasHandle_t handle, cudaStream_t stream, int C, const float* x, float* hidden,
           float* out, const int32_t* counts) const {
    if (C == 0 || count_ == 0) return;
    const int H = config_.feature_dim, O = config_.out_dim(), ld1 = hidden_ld();
    gemm_batched_row_major(handle, C, ld1, H, x, H, int64_t(C) * H, w1_.data<float>(), ld1,
                           int64_t(H) * ld1, hidden, ld1, int64_t(C) * ld1, count_);
    Activate a;
    a.hidden = hidden;
    a.rows = int64_t(count_) * C;
    a.width = width_;
    a.act = int(config_.act);
    a.row_limits = counts;
    a.group_rows = C;
    launch_activate(a, stream);
    gemm_batched_row_major(handle, C, O, width_, hidden, ld1, int64_t(C) * ld1, w2_.data<float>(),
                           O, int64_t(width_) * O, out, O, int64_t(C) * O, count_);
  }

 private:
  MoeConfig config_;
  int count_, width_, halves_;
  Buffer w1_, w2_;
};

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
