// The experts' FFNs on the CPU: per chunk of rows, one BLAS GEMM into the hidden layer, the
// activation in place, one BLAS GEMM out. Weights are stored per expert, f32, row-major:
//
//   W1_e  [H, halves * F']   columns [0, F') = W1 (swiglu's gate), [F', 2F') = W1b (swiglu only)
//   W2_e  [F', O]
//
// where F' = ffn_end - ffn_begin is this object's slice of the hidden columns. Both halves of
// swiglu come out of one GEMM, so the hidden chunk is [rows, 2F'] and silu(gate) * linear is
// written over the gate half.
#include <algorithm>

#include "cpu/gemm.hpp"
#include "moe/activation.hpp"
#include "moe/rows.hpp"
#include "moe/weights.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"

namespace pmoe {

namespace {
// Rows per GEMM call: bounds the hidden workspace ([256, 2F'] f32 is 29 MB at Mixtral's F) while
// keeping each GEMM large enough for BLAS to run at its full rate.
constexpr int64_t kChunkRows = 256;
}  // namespace

struct Experts::Impl {
  MoeConfig config;
  int ffn_begin, width, halves;
  std::vector<Buffer> w1, w2;  // per local expert
  detail::Scratch x_chunk, hidden, y_chunk;
};

namespace {
std::vector<int> consecutive(int first, int count) {
  std::vector<int> experts(size_t(std::max(count, 0)));
  for (int i = 0; i < count; ++i) experts[size_t(i)] = first + i;
  return experts;
}
}  // namespace

Experts::Experts(const MoeConfig& config, int first_expert, int count, int ffn_begin, int ffn_end)
    : Experts(config, consecutive(first_expert, count), ffn_begin, ffn_end) {
  PMOE_CHECK(first_expert >= 0 && count >= 0, "Experts: experts [", first_expert, ", ",
             first_expert + count, ") are not all in [0, num_experts = ", config.num_experts, ")");
}

Experts::Experts(const MoeConfig& given, const std::vector<int>& experts, int ffn_begin,
                 int ffn_end)
    : impl_(std::make_unique<Impl>()),
      first_(experts.empty() ? 0 : experts.front()),
      count_(int(experts.size())) {
  given.validate();
  const MoeConfig config = given.with_current_names();
  for (int e : experts)
    PMOE_CHECK(e >= 0 && e < config.num_experts, "Experts: expert ", e,
               " is not in [0, num_experts = ", config.num_experts, ")");
  PMOE_CHECK(ffn_begin >= 0 && ffn_begin < ffn_end && ffn_end <= config.ffn_dim,
             "Experts: hidden columns [", ffn_begin, ", ", ffn_end,
             ") must be a non-empty part of [0, ffn_dim = ", config.ffn_dim, ")");
  Impl& p = *impl_;
  p.config = config;
  p.ffn_begin = ffn_begin;
  p.width = ffn_end - ffn_begin;
  p.halves = config.w1_halves();
  const int H = config.hidden_dim, O = config.out_dim(), ld1 = p.halves * p.width;
  for (const int e : experts) {
    Buffer w1(DType::f32, {H, ld1}), w2(DType::f32, {p.width, O});
    detail::fill_weights(config, MoeTensor::w1, e, 0, H, ffn_begin, ffn_end, w1.data<float>(), ld1);
    if (p.halves == 2)
      detail::fill_weights(config, MoeTensor::w1_linear, e, 0, H, ffn_begin, ffn_end,
                           w1.data<float>() + p.width, ld1);
    detail::fill_weights(config, MoeTensor::w2, e, ffn_begin, ffn_end, 0, O, w2.data<float>(), O);
    p.w1.push_back(std::move(w1));
    p.w2.push_back(std::move(w2));
  }
}

Experts::~Experts() = default;
Experts::Experts(Experts&&) noexcept = default;
Experts& Experts::operator=(Experts&&) noexcept = default;

size_t Experts::weight_bytes() const {
  size_t bytes = 0;
  for (const Buffer& b : impl_->w1) bytes += b.nbytes();
  for (const Buffer& b : impl_->w2) bytes += b.nbytes();
  return bytes;
}

size_t Experts::workspace_bytes() const {
  return impl_->x_chunk.bytes() + impl_->hidden.bytes() + impl_->y_chunk.bytes();
}

double Experts::flops(int64_t rows) const {
  const Impl& p = *impl_;
  return 2.0 * double(rows) * p.width *
         (double(p.halves) * p.config.hidden_dim + double(p.config.out_dim()));
}

void Experts::forward(int local, const Tensor& x, const Tensor& y) {
  Impl& p = *impl_;
  const int H = p.config.hidden_dim, O = p.config.out_dim();
  PMOE_CHECK(local >= 0 && local < count_, "Experts::forward: local expert ", local,
             " outside [0, ", count_, ")");
  detail::check_rows("Experts::forward", "x", x, -1, H, {DType::f32, DType::bf16}, false);
  const int64_t rows = x.size(0);
  detail::check_rows("Experts::forward", "y", y, rows, O, {DType::f32, DType::bf16}, false);
  if (rows == 0) return;

  const int64_t ld1 = int64_t(p.halves) * p.width, chunk = std::min(rows, kChunkRows);
  float* hidden = p.hidden.get<float>(chunk * ld1);
  const float* w1 = p.w1[size_t(local)].data<float>();
  const float* w2 = p.w2[size_t(local)].data<float>();
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    // The chunk's input rows as f32: in place when x is f32, widened otherwise.
    const float* a;
    int64_t lda;
    if (x.dtype() == DType::f32) {
      a = x.data<float>() + r0 * x.stride(0);
      lda = x.stride(0);
    } else {
      float* widened = p.x_chunk.get<float>(chunk * H);
      detail::rows_to_f32(
          detail::row_view(x.data<bf16>() + r0 * x.stride(0), DType::bf16, n, H, x.stride(0)),
          widened, H);
      a = widened;
      lda = H;
    }
    cpu::gemm_f32(int(n), int(ld1), H, a, int(lda), w1, int(ld1), hidden, int(ld1));
    detail::apply_activation(p.config.act, hidden, n, p.width);
    if (y.dtype() == DType::f32) {
      cpu::gemm_f32(int(n), O, p.width, hidden, int(ld1), w2, O, y.data<float>() + r0 * y.stride(0),
                    int(y.stride(0)));
    } else {
      float* out = p.y_chunk.get<float>(chunk * O);
      cpu::gemm_f32(int(n), O, p.width, hidden, int(ld1), w2, O, out, O);
      detail::rows_from_f32(
          out, O,
          detail::row_view(y.data<bf16>() + r0 * y.stride(0), DType::bf16, n, O, y.stride(0)));
    }
  }
}

}  // namespace pmoe
