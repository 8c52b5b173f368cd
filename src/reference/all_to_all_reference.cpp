#include "reference/all_to_all_reference.hpp"

#include <cstring>

#include "pmoe/error.hpp"

namespace pmoe::reference {

DispatchExpected reference_dispatch(const AllToAllConfig& config, int world_size, int rank,
                                    const std::vector<AllToAllInputs>& all) {
  const int local_experts = config.num_experts / world_size;
  const int k = config.top_k;
  const size_t row_bytes = size_t(config.hidden_dim) * dtype_size(config.in_dtype);
  const size_t scale_bytes = sizeof(float) * size_t(config.scales_per_token());
  DispatchExpected expected;
  expected.counts.assign(size_t(local_experts), 0);
  expected.rows.resize(size_t(local_experts));
  expected.scales.resize(size_t(local_experts));
  for (int e = 0; e < local_experts; ++e) {
    const int expert = rank * local_experts + e;
    for (int source = 0; source < world_size; ++source) {
      const AllToAllInputs& in = all[size_t(source)];
      for (int t = 0; t < in.m; ++t) {
        bool chosen = false;
        for (int j = 0; j < k; ++j) chosen = chosen || in.indices.data<int32_t>()[t * k + j] == expert;
        if (!chosen) continue;
        const auto* row = in.x.data<std::byte>() + t * row_bytes;
        expected.rows[size_t(e)].insert(expected.rows[size_t(e)].end(), row, row + row_bytes);
        if (scale_bytes) {
          const auto* scale = in.x_scale.data<std::byte>() + t * scale_bytes;
          expected.scales[size_t(e)].insert(expected.scales[size_t(e)].end(), scale,
                                            scale + scale_bytes);
        }
        ++expected.counts[size_t(e)];
      }
    }
  }
  return expected;
}

namespace {

// "" if `got` equals `want` byte for byte, else where the first difference is, in units of
// `unit_bytes` (a row).
std::string first_difference(const char* what, const std::byte* got, const std::byte* want,
                             size_t bytes, size_t unit_bytes) {
  if (bytes == 0 || std::memcmp(got, want, bytes) == 0) return "";
  size_t i = 0;
  while (got[i] == want[i]) ++i;
  return detail::cat(what, ": first difference in row ", i / unit_bytes, ", byte ",
                     i % unit_bytes, " (got 0x", std::hex, int(got[i]), ", expected 0x",
                     int(want[i]), ")");
}

bool all_bytes_are(const std::byte* p, size_t bytes, uint8_t value) {
  for (size_t i = 0; i < bytes; ++i)
    if (p[i] != std::byte{value}) return false;
  return true;
}

// The flat row of expert_x / expert_y where local expert e's rows start: its own block, or
// with packed_expert_rows after the rows of the experts before it.
size_t first_row_of_expert(const AllToAllConfig& config, int world_size, const int32_t* counts,
                           int e) {
  if (!config.packed_expert_rows) return size_t(e) * world_size * config.max_tokens;
  size_t row = 0;
  for (int before = 0; before < e; ++before) row += size_t(counts[before]);
  return row;
}

}  // namespace

std::string compare_dispatch(const AllToAllConfig& config, int world_size,
                             const DispatchExpected& expected, const Tensor& expert_num_tokens,
                             const Tensor& expert_x, const Tensor& expert_x_scale,
                             uint8_t sentinel) {
  const int local_experts = config.num_experts / world_size;
  const size_t rows_per_expert = size_t(world_size) * config.max_tokens;
  const size_t row_bytes = size_t(config.hidden_dim) * dtype_size(config.in_dtype);
  const size_t scale_bytes = sizeof(float) * size_t(config.scales_per_token());
  const int32_t* counts = expert_num_tokens.data<int32_t>();
  for (int e = 0; e < local_experts; ++e) {
    const std::string where = detail::cat("local expert ", e);
    if (counts[e] != expected.counts[size_t(e)])
      return detail::cat(where, ": expert_num_tokens is ", counts[e], ", expected ",
                         expected.counts[size_t(e)]);
    const size_t n = size_t(counts[e]);
    const size_t first = first_row_of_expert(config, world_size, counts, e);
    // Padded: the rest of the expert's block is unwritten; packed: every row after the last
    // expert's (checked once, below).
    const size_t unwritten = config.packed_expert_rows ? 0 : rows_per_expert - n;
    const auto* x = expert_x.data<std::byte>() + first * row_bytes;
    std::string diff = first_difference((where + " expert_x").c_str(), x,
                                        expected.rows[size_t(e)].data(), n * row_bytes, row_bytes);
    if (!diff.empty()) return diff;
    if (!all_bytes_are(x + n * row_bytes, unwritten * row_bytes, sentinel))
      return where + ": expert_x rows past expert_num_tokens were written";
    if (scale_bytes) {
      const auto* s = expert_x_scale.data<std::byte>() + first * scale_bytes;
      diff = first_difference((where + " expert_x_scale").c_str(), s,
                              expected.scales[size_t(e)].data(), n * scale_bytes, scale_bytes);
      if (!diff.empty()) return diff;
      if (!all_bytes_are(s + n * scale_bytes, unwritten * scale_bytes, sentinel))
        return where + ": expert_x_scale rows past expert_num_tokens were written";
    }
  }
  if (config.packed_expert_rows) {
    const size_t used = first_row_of_expert(config, world_size, counts, local_experts);
    const size_t all_rows = rows_per_expert * size_t(local_experts);
    if (!all_bytes_are(expert_x.data<std::byte>() + used * row_bytes, (all_rows - used) * row_bytes,
                       sentinel))
      return "packed expert_x: rows past the last expert's were written";
    if (scale_bytes && !all_bytes_are(expert_x_scale.data<std::byte>() + used * scale_bytes,
                                      (all_rows - used) * scale_bytes, sentinel))
      return "packed expert_x_scale: rows past the last expert's were written";
  }
  return "";
}

float expert_fn(float v, int expert) { return v * (1.0f + 0.125f * float(expert)); }

float token_value(const AllToAllConfig& config, const std::byte* row, const float* row_scales,
                  int h) {
  return visit_float_dtype(config.in_dtype, [&](auto tag) {
    using T = decltype(tag);
    const float v = to_float(reinterpret_cast<const T*>(row)[h]);
    return row_scales ? v * row_scales[h / config.scale_block] : v;
  });
}

void fake_expert_row(const AllToAllConfig& config, const std::byte* row, const float* row_scales,
                     int expert, DType out_dtype, void* out) {
  visit_float_dtype(out_dtype, [&](auto tag) {
    using Y = decltype(tag);
    Y* y = static_cast<Y*>(out);
    for (int h = 0; h < config.hidden_dim; ++h)
      y[h] = from_float<Y>(expert_fn(token_value(config, row, row_scales, h), expert));
  });
}

void run_fake_experts(const AllToAllConfig& config, int world_size, int rank,
                      const Tensor& expert_num_tokens, const Tensor& expert_x,
                      const Tensor& expert_x_scale, const Tensor& expert_y) {
  const int local_experts = config.num_experts / world_size;
  const int S = config.scales_per_token();
  const size_t row_bytes = size_t(config.hidden_dim) * dtype_size(config.in_dtype);
  const size_t out_row_bytes = size_t(config.hidden_dim) * dtype_size(expert_y.dtype());
  const int32_t* counts = expert_num_tokens.data<int32_t>();
  for (int e = 0; e < local_experts; ++e) {
    const size_t first = first_row_of_expert(config, world_size, counts, e);
    for (int i = 0; i < counts[e]; ++i) {
      const size_t row = first + size_t(i);
      fake_expert_row(config, expert_x.data<std::byte>() + row * row_bytes,
                      S ? expert_x_scale.data<float>() + row * S : nullptr,
                      rank * local_experts + e, expert_y.dtype(),
                      expert_y.data<std::byte>() + row * out_row_bytes);
    }
  }
}

Buffer reference_combine(const AllToAllConfig& config, const AllToAllInputs& mine,
                         DType expert_y_dtype) {
  const int H = config.hidden_dim, k = config.top_k, S = config.scales_per_token();
  const size_t row_bytes = size_t(H) * dtype_size(config.in_dtype);
  Buffer y(config.out_dtype, {mine.m, H});
  for (int t = 0; t < mine.m; ++t) {
    const auto* x = mine.x.data<std::byte>() + t * row_bytes;
    const float* scales = S ? mine.x_scale.data<float>() + t * S : nullptr;
    for (int h = 0; h < H; ++h) {
      float acc = 0.0f;
      for (int j = 0; j < k; ++j) {
        const int expert = mine.indices.data<int32_t>()[t * k + j];
        if (expert < 0) continue;
        const float w = mine.weights.data<float>()[t * k + j];
        // What the expert wrote, rounded to expert_y's dtype, read back as f32.
        const float out = expert_fn(token_value(config, x, scales, h), expert);
        const float v = visit_float_dtype(expert_y_dtype,
                                          [&](auto tag) { return to_float(from_float<decltype(tag)>(out)); });
        acc += w * v;
      }
      visit_float_dtype(config.out_dtype, [&](auto tag) {
        using Out = decltype(tag);
        y.data<Out>()[size_t(t) * H + h] = from_float<Out>(acc);
      });
    }
  }
  return y;
}

std::string compare_bytes(const char* what, const Tensor& got, const Tensor& expected) {
  if (got.nbytes() != expected.nbytes())
    return detail::cat(what, ": ", got.nbytes(), " bytes, expected ", expected.nbytes());
  const size_t row = got.dim() >= 2 ? size_t(got.size(got.dim() - 1)) * dtype_size(got.dtype())
                                    : got.nbytes();
  return first_difference(what, got.data<std::byte>(), expected.data<std::byte>(), got.nbytes(),
                          row ? row : 1);
}

}  // namespace pmoe::reference
