#include "moe/weights.hpp"

#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

// One weight from its counters; `scale` = 2 sqrt(3 / rows), the width of [-a, a).
inline float weight_value(const MoeConfig& config, uint64_t stream, int64_t row, int64_t col,
                          float scale) {
  const float u = float(weight_hash(config.seed, stream, uint64_t(row), uint64_t(col)) >> 40) *
                  (1.0f / float(1 << 24));
  const float v = (u - 0.5f) * scale;
  return config.dtype == DType::bf16 ? to_float(to_bf16(v)) : v;
}

// The counter stream of one tensor of one expert.
uint64_t stream_of(MoeTensor tensor, int expert) {
  return (uint64_t(tensor) + 1) << 32 | uint64_t(uint32_t(expert));
}

float scale_of(const MoeConfig& config, MoeTensor tensor) {
  return 2.0f * std::sqrt(3.0f / float(weight_rows(config, tensor)));
}

}  // namespace

int64_t weight_rows(const MoeConfig& config, MoeTensor tensor) {
  return tensor == MoeTensor::w2 ? config.ffn_dim : config.hidden_dim;
}

void fill_weights(const MoeConfig& config, MoeTensor tensor, int expert, int64_t row_begin,
                  int64_t row_end, int64_t col_begin, int64_t col_end, float* out, int64_t ld) {
  const uint64_t stream = stream_of(tensor, tensor == MoeTensor::router ? 0 : expert);
  const float scale = scale_of(config, tensor);
  for (int64_t r = row_begin; r < row_end; ++r) {
    float* row = out + (r - row_begin) * ld;
    for (int64_t c = col_begin; c < col_end; ++c)
      row[c - col_begin] = weight_value(config, stream, r, c, scale);
  }
}

}  // namespace pmoe::detail

namespace pmoe {

float moe_weight(const MoeConfig& config, MoeTensor tensor, int expert, int64_t row, int64_t col) {
  float value = 0;
  detail::fill_weights(config.with_current_names(), tensor, expert, row, row + 1, col, col + 1,
                       &value, 1);
  return value;
}

}  // namespace pmoe
