// __half and __nv_bfloat16 on the emulated device, with the conversions pmoe's kernels call.
// Rounding is the GPU's: to nearest, ties to even; a NaN becomes the canonical NaN 0x7fff, as
// cvt.rn.f16.f32 and cvt.rn.bf16.f32 give (pmoe's CPU conversions keep the payload instead).
#pragma once

#include <cstdint>
#include <cstring>

#include "pmoe/dtype.hpp"

struct __half {
  uint16_t __x;
};
struct __nv_bfloat16 {
  uint16_t __x;
};

inline float __half2float(__half h) { return ::pmoe::to_float(::pmoe::f16{h.__x}); }
inline float __bfloat162float(__nv_bfloat16 b) { return ::pmoe::to_float(::pmoe::bf16{b.__x}); }

inline bool pmoe_emu_is_nan(float x) { return (::pmoe::float_bits(x) & 0x7fffffffu) > 0x7f800000u; }

inline __half __float2half_rn(float x) {
  if (pmoe_emu_is_nan(x)) return __half{0x7fff};
  return __half{::pmoe::to_f16(x).bits};
}
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  if (pmoe_emu_is_nan(x)) return __nv_bfloat16{0x7fff};
  return __nv_bfloat16{::pmoe::to_bf16(x).bits};
}
inline __half __float2half(float x) { return __float2half_rn(x); }
inline __nv_bfloat16 __float2bfloat16(float x) { return __float2bfloat16_rn(x); }
