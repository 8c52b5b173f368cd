#include "cpu/local_moe.hpp"

#include <algorithm>
#include <chrono>

namespace pmoe::detail {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

LocalMoe::LocalMoe(const MoeConfig& config, int max_tokens, int ffn_begin, int ffn_end)
    : config_(config),
      max_tokens_(max_tokens),
      router_(config),
      experts_(config, 0, config.num_experts, ffn_begin, ffn_end),
      indices_(DType::i32, {max_tokens, config.top_k}),
      weights_(DType::f32, {max_tokens, config.top_k}),
      gathered_(DType::f32, {max_tokens, config.hidden_dim}),
      expert_out_(DType::f32, {int64_t(max_tokens) * config.top_k, config.out_dim()}),
      offsets_(size_t(config.num_experts) + 1) {
  if (config.dtype != DType::f32) x_f32_ = Buffer(DType::f32, {max_tokens, config.hidden_dim});
}

size_t LocalMoe::workspace_bytes() const {
  return router_.workspace_bytes() + x_f32_.nbytes() + indices_.nbytes() + weights_.nbytes() +
         gathered_.nbytes() + expert_out_.nbytes() + experts_.workspace_bytes() +
         sizeof(int32_t) *
             (offsets_.capacity() + pair_of_row_.capacity() + row_of_pair_.capacity());
}

// A counting sort of the pairs by expert; within an expert, pairs stay in token order.
void LocalMoe::group_pairs(int m) {
  const int k = config_.top_k, E = config_.num_experts;
  const int32_t* idx = indices_.data<int32_t>();
  std::fill(offsets_.begin(), offsets_.end(), 0);
  for (int p = 0; p < m * k; ++p) ++offsets_[size_t(idx[p]) + 1];
  for (int e = 0; e < E; ++e) offsets_[size_t(e) + 1] += offsets_[size_t(e)];
  pair_of_row_.resize(size_t(m) * k);
  row_of_pair_.resize(size_t(m) * k);
  std::vector<int32_t> next(offsets_.begin(), offsets_.end() - 1);
  for (int p = 0; p < m * k; ++p) {
    const int32_t row = next[size_t(idx[p])]++;
    pair_of_row_[size_t(row)] = p;
    row_of_pair_[size_t(p)] = row;
  }
}

void LocalMoe::forward(const Tensor& x, float* y_acc, MoeStats& stats) {
  using Clock = std::chrono::steady_clock;
  const int m = int(x.size(0)), k = config_.top_k, H = config_.hidden_dim, O = config_.out_dim();
  stats.tokens = m;
  stats.router_flops = router_.flops(m);
  auto start = Clock::now();
  const float* xf = x.data<float>();
  if (config_.dtype != DType::f32) {
    rows_to_f32(x, x_f32_.data<float>(), H);
    xf = x_f32_.data<float>();
  }
  router_.route(row_view(const_cast<float*>(xf), DType::f32, m, H, H),
                row_view(indices_.data<int32_t>(), DType::i32, m, k, k),
                row_view(weights_.data<float>(), DType::f32, m, k, k));
  stats.route_s = seconds_since(start);

  start = Clock::now();
  group_pairs(m);
  float* gathered = gathered_.data<float>();
  float* out = expert_out_.data<float>();
  for (int e = 0; e < config_.num_experts; ++e) {
    const int first = offsets_[size_t(e)], rows = offsets_[size_t(e) + 1] - first;
    if (rows == 0) continue;
    for (int i = 0; i < rows; ++i) {
      const int t = pair_of_row_[size_t(first + i)] / k;
      std::copy_n(xf + int64_t(t) * H, H, gathered + int64_t(i) * H);
    }
    experts_.forward(e, row_view(gathered, DType::f32, rows, H, H),
                     row_view(out + int64_t(first) * O, DType::f32, rows, O, O));
  }
  stats.expert_rows = stats.expert_rows_used = stats.expert_rows_live = int64_t(m) * k;
  stats.expert_flops = experts_.flops(stats.expert_rows);
  stats.experts_s = seconds_since(start);

  start = Clock::now();
  const float* w = weights_.data<float>();
  for (int t = 0; t < m; ++t) {
    float* acc = y_acc + int64_t(t) * O;
    std::fill(acc, acc + O, 0.0f);
    for (int j = 0; j < k; ++j) {
      const float weight = w[t * k + j];
      const float* row = out + int64_t(row_of_pair_[size_t(t * k + j)]) * O;
      for (int o = 0; o < O; ++o) acc[o] += weight * row[o];
    }
  }
  stats.combine_s = seconds_since(start);
}

}  // namespace pmoe::detail
