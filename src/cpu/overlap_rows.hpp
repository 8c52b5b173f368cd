// Element-wise row work of the CPU overlap ops: 16-bit storage is widened to f32 before BLAS,
// f32 results are rounded back once, and partial products are summed in f32. All counts are in
// elements of contiguous rows. `dtype` is f32, bf16 or f16.
#pragma once

#include <cstdint>

#include "pmoe/dtype.hpp"

namespace pmoe::detail {

// dst[i] = float(src[i]).
void widen(DType dtype, const void* src, float* dst, int64_t count);
// dst[i] = src[i] rounded to dtype (round to nearest even).
void narrow(const float* src, DType dtype, void* dst, int64_t count);
// acc[i] += float(src[i]).
void accumulate(float* acc, DType dtype, const void* src, int64_t count);
// acc[i] += src[i].
void accumulate(float* acc, const float* src, int64_t count);

}  // namespace pmoe::detail
