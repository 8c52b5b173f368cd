// The router: one BLAS GEMM for the logits, then per token a top-k selection and a softmax over
// the k chosen logits, in f32.
#include <cmath>
#include <vector>

#include "cpu/gemm.hpp"
#include "moe/rows.hpp"
#include "moe/weights.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"

namespace pmoe {

Router::Router(const MoeConfig& config) : config_(config.with_current_names()) {
  config.validate();
  const MoeConfig& c = config_;
  weights_ = Buffer(DType::f32, {c.hidden_dim, c.num_experts});
  detail::fill_weights(c, MoeTensor::router, 0, 0, c.hidden_dim, 0, c.num_experts,
                       weights_.data<float>(), c.num_experts);
}

size_t Router::weight_bytes() const { return weights_.nbytes(); }

double Router::flops(int64_t tokens) const {
  return 2.0 * double(tokens) * config_.hidden_dim * config_.num_experts;
}

void Router::route(const Tensor& x, const Tensor& indices, const Tensor& weights) {
  const int E = config_.num_experts, k = config_.top_k, H = config_.hidden_dim;
  detail::check_rows("Router::route", "x", x, -1, H, {DType::f32, DType::bf16}, false);
  const int64_t m = x.size(0);
  detail::check_rows("Router::route", "indices", indices, m, k, {DType::i32}, true);
  detail::check_rows("Router::route", "weights", weights, m, k, {DType::f32}, true);
  if (m == 0) return;
  if (logits_.nbytes() < size_t(m) * E * sizeof(float)) {
    logits_ = Buffer();
    logits_ = Buffer(DType::f32, {m, E});
  }
  float* logits = logits_.data<float>();
  cpu::gemm(x, weights_, detail::row_view(logits, DType::f32, m, E, E));

  int32_t* idx = indices.data<int32_t>();
  float* w = weights.data<float>();
  std::vector<char> taken(size_t(E), 0);
  for (int64_t t = 0; t < m; ++t) {
    const float* l = logits + t * E;
    std::fill(taken.begin(), taken.end(), 0);
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e)  // strict '>' keeps the lower expert on a tie
        if (!taken[size_t(e)] && (best < 0 || l[e] > l[best])) best = e;
      taken[size_t(best)] = 1;
      idx[t * k + j] = best;
    }
    // Softmax over the k chosen logits; the first is the largest.
    const float top = l[idx[t * k]];
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      w[t * k + j] = std::exp(l[idx[t * k + j]] - top);
      sum += w[t * k + j];
    }
    for (int j = 0; j < k; ++j) w[t * k + j] /= sum;
  }
}

}  // namespace pmoe
