// The dtypes an AllToAll moves: what dispatch may carry, and what combine may take and give.
#pragma once

#include "pmoe/dtype.hpp"

namespace pmoe::detail {

inline bool is_payload_dtype(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f8e4m3;
}
inline bool is_output_dtype(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

}  // namespace pmoe::detail
