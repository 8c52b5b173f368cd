#include "reference/overlap_reference.hpp"

#include <cmath>
#include <numeric>

#include "pmoe/error.hpp"
#include "reference/workload.hpp"

namespace pmoe::reference {
namespace {

double element(const Tensor& t, int64_t r, int64_t c) {
  const int64_t i = r * t.stride(0) + c;
  if (t.dtype() == DType::f16) return double(to_float(t.data<f16>()[i]));
  return t.dtype() == DType::f32 ? double(t.data<float>()[i]) : double(to_float(t.data<bf16>()[i]));
}

std::vector<int64_t> all_indices(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The error the op may make in an element: BLAS's f32 accumulation over `k` products whose
// magnitudes sum to `abs_products`, plus roundings in `out` of values no larger than `rounded`.
double allowed_error(DType out, int64_t k, double abs_products, double rounded) {
  const double f32_unit = std::ldexp(1.0, -24);
  // f32 keeps 24 significant bits, f16 11, bf16 8 (one unit of the last place, twice the
  // rounding bound, as before).
  const double rounding_unit = out == DType::f32   ? std::ldexp(1.0, -23)
                               : out == DType::f16 ? std::ldexp(1.0, -10)
                                                   : std::ldexp(1.0, -7);
  return f32_unit * double(k / 4 + 8) * abs_products + rounding_unit * rounded;
}

// value = sum over sources of their partial sums; abs = sum of |products|; the rounded
// magnitude: |value| for one rounding of the result, plus W times sum |partial| when partial
// sums travel rounded (GemmReduceScatter).
struct Accumulated {
  double value = 0, abs_products = 0, abs_partials = 0;
};

}  // namespace

float operand_value(uint64_t seed, Operand which, int64_t row, int64_t col, DType dtype) {
  const float v =
      2.0f * uniform(seed, 0x0be7a00 + uint64_t(which), uint64_t(row), uint64_t(col)) - 1.0f;
  if (dtype == DType::f16) return to_float(to_f16(v));
  return dtype == DType::bf16 ? to_float(to_bf16(v)) : v;
}

void fill_operand(const Tensor& t, uint64_t seed, Operand which, int64_t row0, int64_t col0) {
  PMOE_CHECK(t.dim() == 2 && (t.dtype() == DType::f32 || t.dtype() == DType::bf16 ||
                              t.dtype() == DType::f16),
             "fill_operand: expected a 2-D f32, bf16 or f16 tensor, got ", dtype_name(t.dtype()),
             " ", t.shape_str());
  for (int64_t r = 0; r < t.size(0); ++r)
    for (int64_t c = 0; c < t.size(1); ++c) {
      const float v = operand_value(seed, which, row0 + r, col0 + c, t.dtype());
      const int64_t i = r * t.stride(0) + c;
      if (t.dtype() == DType::f32)
        t.data<float>()[i] = v;
      else if (t.dtype() == DType::f16)
        t.data<f16>()[i] = to_f16(v);
      else
        t.data<bf16>()[i] = to_bf16(v);
    }
}

OverlapInputs make_all_gather_gemm_inputs(const OverlapConfig& c, int W, int rank, uint64_t seed) {
  OverlapInputs in{Buffer(c.dtype, {c.m / W, c.k}), Buffer(c.dtype, {c.k, c.n / W})};
  fill_operand(in.A, seed, Operand::a, rank * (c.m / W), 0);
  fill_operand(in.B, seed, Operand::b, 0, rank * (c.n / W));
  return in;
}

OverlapInputs make_gemm_reduce_scatter_inputs(const OverlapConfig& c, int W, int rank,
                                              uint64_t seed) {
  OverlapInputs in{Buffer(c.dtype, {c.m, c.k / W}), Buffer(c.dtype, {c.k / W, c.n})};
  fill_operand(in.A, seed, Operand::a, 0, rank * (c.k / W));
  fill_operand(in.B, seed, Operand::b, rank * (c.k / W), 0);
  return in;
}

Expected all_gather_gemm_reference(const std::vector<Tensor>& a_parts, const Tensor& b, DType out) {
  // The all-gather: every rank's rows, in rank order.
  std::vector<std::vector<double>> gathered;
  for (const Tensor& part : a_parts)
    for (int64_t r = 0; r < part.size(0); ++r) {
      std::vector<double> row(size_t(part.size(1)));
      for (int64_t c = 0; c < part.size(1); ++c) row[size_t(c)] = element(part, r, c);
      gathered.push_back(std::move(row));
    }
  const int64_t M = int64_t(gathered.size()), K = b.size(0), N = b.size(1);
  Expected want{all_indices(M), all_indices(N), {}, {}};
  // The GEMM.
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double value = 0, abs_products = 0;
      for (int64_t p = 0; p < K; ++p) {
        const double product = gathered[size_t(i)][size_t(p)] * element(b, p, j);
        value += product;
        abs_products += std::abs(product);
      }
      want.value.push_back(value);
      want.tolerance.push_back(allowed_error(out, K, abs_products, std::abs(value)));
    }
  return want;
}

Expected gemm_reduce_scatter_reference(const std::vector<Tensor>& a_parts,
                                       const std::vector<Tensor>& b_parts, int rank, DType out) {
  const int W = int(a_parts.size());
  const int64_t M = a_parts[0].size(0), N = b_parts[0].size(1), rows = M / W;
  std::vector<Accumulated> sums(size_t(rows * N));
  int64_t K = 0;
  for (int s = 0; s < W; ++s) {
    // Rank s's GEMM, A_s . B_s, of which the reduce-scatter keeps block `rank`'s rows here.
    const Tensor &a = a_parts[size_t(s)], &b = b_parts[size_t(s)];
    K += a.size(1);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double partial = 0;
        Accumulated& sum = sums[size_t(i * N + j)];
        for (int64_t p = 0; p < a.size(1); ++p) {
          const double product = element(a, rank * rows + i, p) * element(b, p, j);
          partial += product;
          sum.abs_products += std::abs(product);
        }
        sum.value += partial;
        sum.abs_partials += std::abs(partial);
      }
  }
  Expected want{all_indices(rows), all_indices(N), {}, {}};
  for (const Accumulated& sum : sums) {
    want.value.push_back(sum.value);
    want.tolerance.push_back(
        allowed_error(out, K, sum.abs_products, W * sum.abs_partials + std::abs(sum.value)));
  }
  return want;
}

Expected sampled_reference(bool gather, const OverlapConfig& c, int W, int rank, uint64_t seed,
                           const std::vector<int64_t>& rows, const std::vector<int64_t>& cols) {
  Expected want{rows, cols, {}, {}};
  const int64_t k_slice = c.k / W;
  for (int64_t i : rows)
    for (int64_t j : cols) {
      // The global element of C = A . B that this rank's C holds at (i, j).
      const int64_t row = gather ? i : rank * (c.m / W) + i;
      const int64_t col = gather ? rank * (c.n / W) + j : j;
      Accumulated sum;
      for (int s = 0; s < (gather ? 1 : W); ++s) {
        const int64_t k0 = gather ? 0 : s * k_slice, k1 = gather ? c.k : k0 + k_slice;
        double partial = 0;
        for (int64_t p = k0; p < k1; ++p) {
          const double product = double(operand_value(seed, Operand::a, row, p, c.dtype)) *
                                 double(operand_value(seed, Operand::b, p, col, c.dtype));
          partial += product;
          sum.abs_products += std::abs(product);
        }
        sum.value += partial;
        sum.abs_partials += std::abs(partial);
      }
      const double rounded =
          gather ? std::abs(sum.value) : W * sum.abs_partials + std::abs(sum.value);
      want.value.push_back(sum.value);
      want.tolerance.push_back(allowed_error(c.dtype, c.k, sum.abs_products, rounded));
    }
  return want;
}

std::string compare_close(std::string_view what, const Tensor& got, const Expected& want) {
  std::string report;
  int64_t bad = 0;
  size_t e = 0;
  for (int64_t i : want.rows)
    for (int64_t j : want.cols) {
      const double value = element(got, i, j);
      const double error = std::abs(value - want.value[e]);
      if (!(error <= want.tolerance[e])) {  // NaN fails too
        if (++bad <= 5)
          report +=
              detail::cat("\n  ", what, "[", i, ", ", j, "] = ", value, ", expected ",
                          want.value[e], " (error ", error, " > allowed ", want.tolerance[e], ")");
      }
      ++e;
    }
  if (bad == 0) return "";
  return detail::cat(what, ": ", bad, " of ", want.value.size(),
                     " elements differ from the "
                     "reference",
                     report);
}

}  // namespace pmoe::reference
