#include "reference/moe_reference.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "pmoe/error.hpp"
#include "reference/workload.hpp"

namespace pmoe::reference {
namespace {

double value_at(const Tensor& t, int64_t r, int64_t c) {
  const int64_t i = r * t.stride(0) + c;
  return t.dtype() == DType::f32 ? double(t.data<float>()[i]) : double(to_float(t.data<bf16>()[i]));
}

double activate(Activation act, double gate, double linear) {
  switch (act) {
    case Activation::relu:
      return gate > 0 ? gate : 0.0;
    case Activation::gelu:
      return 0.5 * gate * (1.0 + std::erf(gate / std::sqrt(2.0)));
    case Activation::swiglu:
      return gate / (1.0 + std::exp(-gate)) * linear;
  }
  return 0;
}

// One expert's weights, materialised from moe_weight().
struct ExpertWeights {
  std::vector<float> w1, w1_linear, w2;  // [H, F], [H, F] (swiglu), [F, O]
};

ExpertWeights build_expert(const MoeConfig& c, int e) {
  const int H = c.hidden_dim, F = c.ffn_dim, O = c.out_dim();
  ExpertWeights w;
  w.w1.resize(size_t(H) * F);
  for (int h = 0; h < H; ++h)
    for (int f = 0; f < F; ++f) w.w1[size_t(h) * F + f] = moe_weight(c, MoeTensor::w1, e, h, f);
  if (c.act == Activation::swiglu) {
    w.w1_linear.resize(size_t(H) * F);
    for (int h = 0; h < H; ++h)
      for (int f = 0; f < F; ++f)
        w.w1_linear[size_t(h) * F + f] = moe_weight(c, MoeTensor::w1_linear, e, h, f);
  }
  w.w2.resize(size_t(F) * O);
  for (int f = 0; f < F; ++f)
    for (int o = 0; o < O; ++o) w.w2[size_t(f) * O + o] = moe_weight(c, MoeTensor::w2, e, f, o);
  return w;
}

// FFN_e(x row) in double, and beside it the magnitude of the terms that make each output: the
// same sums over |x| and |W|, with |act(gate)| bounded by the gate's magnitude (times the linear
// term's for swiglu; |relu(g)|, |gelu(g)| and |silu(g)| are all at most |g|). A rounding of any
// term (an input, a weight, a hidden value) moves the output by at most its relative size times
// this magnitude, however much the terms cancel.
struct ExpertOutput {
  std::vector<double> y, magnitude;  // [O] each
};

ExpertOutput run_expert(const MoeConfig& c, const ExpertWeights& w, const std::vector<double>& x) {
  const int H = c.hidden_dim, F = c.ffn_dim, O = c.out_dim();
  const bool swiglu = c.act == Activation::swiglu;
  std::vector<double> gate(size_t(F), 0.0), linear(size_t(F), 0.0);
  std::vector<double> gate_mag(size_t(F), 0.0), linear_mag(size_t(F), 0.0);
  ExpertOutput out{std::vector<double>(size_t(O), 0.0), std::vector<double>(size_t(O), 0.0)};
  for (int h = 0; h < H; ++h) {
    const double xh = x[size_t(h)];
    for (int f = 0; f < F; ++f) {
      gate[size_t(f)] += xh * w.w1[size_t(h) * F + f];
      gate_mag[size_t(f)] += std::abs(xh * w.w1[size_t(h) * F + f]);
    }
    if (swiglu)
      for (int f = 0; f < F; ++f) {
        linear[size_t(f)] += xh * w.w1_linear[size_t(h) * F + f];
        linear_mag[size_t(f)] += std::abs(xh * w.w1_linear[size_t(h) * F + f]);
      }
  }
  for (int f = 0; f < F; ++f) {
    const double a = activate(c.act, gate[size_t(f)], linear[size_t(f)]);
    const double a_mag = gate_mag[size_t(f)] * (swiglu ? linear_mag[size_t(f)] : 1.0);
    for (int o = 0; o < O; ++o) {
      out.y[size_t(o)] += a * w.w2[size_t(f) * O + o];
      out.magnitude[size_t(o)] += a_mag * std::abs(w.w2[size_t(f) * O + o]);
    }
  }
  return out;
}

}  // namespace

Buffer make_moe_input(const MoeConfig& config, int tokens, uint64_t seed) {
  const int H = config.hidden_dim;
  Buffer x(config.dtype, {tokens, H});
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < H; ++h) {
      const float v = 2.0f * uniform(seed, 0x4d6f45, uint64_t(t), uint64_t(h)) - 1.0f;
      if (config.dtype == DType::f32)
        x.data<float>()[size_t(t) * H + h] = v;
      else
        x.data<bf16>()[size_t(t) * H + h] = to_bf16(v);
    }
  return x;
}

std::vector<int> all_rows(int tokens) {
  std::vector<int> rows(static_cast<size_t>(tokens));
  std::iota(rows.begin(), rows.end(), 0);
  return rows;
}

double moe_tolerance(DType dtype) { return dtype == DType::f32 ? 1e-5 : 1e-2; }

MoeExpected reference_moe(const MoeConfig& c, const Tensor& x, const std::vector<int>& rows) {
  c.validate();
  const int H = c.hidden_dim, E = c.num_experts, k = c.top_k, O = c.out_dim();
  MoeExpected out;
  out.rows = rows;
  out.y.assign(rows.size() * size_t(O), 0.0);
  out.magnitude.assign(rows.size() * size_t(O), 0.0);
  out.ambiguous.assign(rows.size(), 0);

  // Route every row: logits in double, top-k by descending logit, softmax over the k.
  std::vector<std::vector<double>> inputs(rows.size());
  std::map<int, std::vector<std::pair<size_t, double>>> by_expert;  // expert -> (row, weight)
  for (size_t i = 0; i < rows.size(); ++i) {
    inputs[i].resize(size_t(H));
    for (int h = 0; h < H; ++h) inputs[i][size_t(h)] = value_at(x, rows[i], h);
    std::vector<double> logits(size_t(E), 0.0);
    for (int e = 0; e < E; ++e)
      for (int h = 0; h < H; ++h)
        logits[size_t(e)] += inputs[i][size_t(h)] * moe_weight(c, MoeTensor::router, 0, h, e);
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
    if (k < E && logits[size_t(order[size_t(k - 1)])] - logits[size_t(order[size_t(k)])] < kTieGap)
      out.ambiguous[i] = 1;
    double sum = 0;
    std::vector<double> weight(static_cast<size_t>(k));
    for (int j = 0; j < k; ++j) {
      weight[size_t(j)] = std::exp(logits[size_t(order[size_t(j)])] - logits[size_t(order[0])]);
      sum += weight[size_t(j)];
    }
    for (int j = 0; j < k; ++j) by_expert[order[size_t(j)]].push_back({i, weight[size_t(j)] / sum});
  }

  // One expert at a time, so that only one expert's weights are held.
  for (const auto& [e, uses] : by_expert) {
    const ExpertWeights w = build_expert(c, e);
    for (const auto& [i, weight] : uses) {
      const ExpertOutput e_out = run_expert(c, w, inputs[i]);
      for (int o = 0; o < O; ++o) {
        out.y[i * size_t(O) + size_t(o)] += weight * e_out.y[size_t(o)];
        out.magnitude[i * size_t(O) + size_t(o)] += weight * e_out.magnitude[size_t(o)];
      }
    }
  }
  return out;
}

MoeComparison compare_moe(const MoeConfig& c, const MoeExpected& expected, const Tensor& got,
                          int first_row, double tolerance) {
  const int O = c.out_dim();
  const int64_t n = got.size(0);
  MoeComparison result;
  if (got.dim() != 2 || got.size(1) != O) {
    result.error =
        detail::cat("output has shape ", got.shape_str(), ", expected [", n, ", ", O, "]");
    return result;
  }
  for (size_t i = 0; i < expected.rows.size(); ++i) {
    const int row = expected.rows[i] - first_row;
    if (row < 0 || row >= n) continue;
    if (expected.ambiguous[i]) {
      ++result.skipped;
      continue;
    }
    ++result.compared;
    for (int o = 0; o < O; ++o) {
      const size_t at = i * size_t(O) + size_t(o);
      const double want = expected.y[at], have = value_at(got, row, o);
      const double magnitude = expected.magnitude[at];
      // No terms (magnitude 0): the output is exactly 0, and any other value is wrong.
      const double error = std::isnan(have) || (magnitude == 0 && have != want)
                               ? INFINITY
                               : (magnitude == 0 ? 0.0 : std::abs(have - want) / magnitude);
      if (error > result.max_error || std::isnan(have)) {
        result.max_error = error;
        if (error > tolerance)
          result.error = detail::cat(
              "token ", expected.rows[i], " column ", o, ": got ", have, ", expected ", want,
              " (error ", error, " relative to the magnitude of its terms, ", magnitude,
              ", tolerance ", tolerance, ")");
      }
    }
  }
  return result;
}

}  // namespace pmoe::reference
