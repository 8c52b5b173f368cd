#include "cpu/overlap_rows.hpp"

#include <cstring>

namespace pmoe::detail {

void widen(DType dtype, const void* src, float* dst, int64_t count) {
  if (dtype == DType::f32) {
    std::memcpy(dst, src, size_t(count) * sizeof(float));
    return;
  }
  visit_float_dtype(dtype, [&]<typename T>(T) {
    const auto* in = static_cast<const T*>(src);
    for (int64_t i = 0; i < count; ++i) dst[i] = to_float(in[i]);
  });
}

void narrow(const float* src, DType dtype, void* dst, int64_t count) {
  if (dtype == DType::f32) {
    std::memcpy(dst, src, size_t(count) * sizeof(float));
    return;
  }
  visit_float_dtype(dtype, [&]<typename T>(T) {
    auto* out = static_cast<T*>(dst);
    for (int64_t i = 0; i < count; ++i) out[i] = from_float<T>(src[i]);
  });
}

void accumulate(float* acc, DType dtype, const void* src, int64_t count) {
  if (dtype == DType::f32) return accumulate(acc, static_cast<const float*>(src), count);
  visit_float_dtype(dtype, [&]<typename T>(T) {
    const auto* in = static_cast<const T*>(src);
    for (int64_t i = 0; i < count; ++i) acc[i] += to_float(in[i]);
  });
}

void accumulate(float* acc, const float* src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) acc[i] += src[i];
}

}  // namespace pmoe::detail
