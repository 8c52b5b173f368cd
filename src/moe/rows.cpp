#include "moe/rows.hpp"

#include <algorithm>
#include <string>

#include "core/arg_checks.hpp"
#include "pmoe/dtype.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {

void check_rows(const char* op, const char* name, const Tensor& t, int64_t rows, int64_t cols,
                std::initializer_list<DType> dtypes, bool contiguous, Device device) {
  std::string allowed;
  bool dtype_ok = false;
  for (DType d : dtypes) {
    allowed += (allowed.empty() ? "" : " or ") + dtype_words(d);
    dtype_ok = dtype_ok || t.dtype() == d;
  }
  const std::string expected =
      detail::cat("[", rows >= 0 ? std::to_string(rows) : "m", ", ", cols, "] ", allowed);
  PMOE_CHECK(!t.empty(), op, ": `", name, "` is missing (expected ", expected, ")");
  PMOE_CHECK(t.dim() == 2 && t.size(1) == cols && (rows < 0 || t.size(0) == rows), op, ": `", name,
             "` must have shape ", expected, ", got ", t.shape_str());
  PMOE_CHECK(dtype_ok, op, ": `", name, "` must be ", allowed, ", got ", dtype_words(t.dtype()));
  check_device(op, name, t, device);
  PMOE_CHECK(t.data() != nullptr || t.numel() == 0, op, ": `", name, "` has no data pointer");
  if (contiguous) {
    PMOE_CHECK(t.is_contiguous(), op, ": `", name, "` must be row-major contiguous");
  } else {
    PMOE_CHECK(t.size(0) <= 1 || (t.stride(1) == 1 && t.stride(0) >= cols), op, ": `", name,
               "` must be row-major with unit stride in its last dimension");
  }
}

void rows_to_f32(const Tensor& src, float* dst, int64_t ld) {
  const int64_t rows = src.size(0), cols = src.size(1), lds = src.stride(0);
  if (src.dtype() == DType::f32) {
    const float* s = src.data<float>();
    for (int64_t r = 0; r < rows; ++r) std::copy_n(s + r * lds, cols, dst + r * ld);
    return;
  }
  const bf16* s = src.data<bf16>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * ld + c] = to_float(s[r * lds + c]);
}

void rows_from_f32(const float* src, int64_t ld, const Tensor& dst) {
  const int64_t rows = dst.size(0), cols = dst.size(1), ldd = dst.stride(0);
  if (dst.dtype() == DType::f32) {
    float* d = dst.data<float>();
    for (int64_t r = 0; r < rows; ++r) std::copy_n(src + r * ld, cols, d + r * ldd);
    return;
  }
  bf16* d = dst.data<bf16>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) d[r * ldd + c] = to_bf16(src[r * ld + c]);
}

Tensor row_view(void* data, DType dtype, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t shape[2] = {rows, cols}, strides[2] = {ld, 1};
  return Tensor(data, dtype, 2, shape, strides);
}

void Scratch::reserve(size_t bytes) {
  if (bytes <= buffer_.nbytes()) return;
  buffer_ = Buffer();  // free first: the peak is the new size, not old + new
  buffer_ = Buffer(DType::f32, {int64_t((bytes + 3) / 4)});
}

}  // namespace pmoe::detail
