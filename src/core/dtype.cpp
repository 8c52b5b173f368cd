#include "pmoe/dtype.hpp"

#include <cmath>
#include <limits>

#include "pmoe/error.hpp"

namespace pmoe {

DType parse_dtype(std::string_view name) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f8e4m3, DType::i32, DType::i64})
    if (dtype_name(t) == name) return t;
  if (name == "f8" || name == "fp8" || name == "float8_e4m3fn") return DType::f8e4m3;
  if (name == "float32" || name == "float") return DType::f32;
  if (name == "float16" || name == "half") return DType::f16;
  if (name == "bfloat16") return DType::bf16;
  if (name == "int32") return DType::i32;
  if (name == "int64") return DType::i64;
  throw Error(detail::cat("unknown dtype '", name, "': expected f32, f16, bf16, f8e4m3, i32 or i64"));
}

float to_float(f16 x) {
  const uint32_t sign = uint32_t(x.bits & 0x8000u) << 16;
  const uint32_t exp = (x.bits >> 10) & 0x1fu;
  const uint32_t man = x.bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));  // inf or NaN
  if (exp != 0) return bits_float(sign | ((exp + 112) << 23) | (man << 13));
  // Subnormal (or zero): man * 2^-24, exact in float.
  const float magnitude = std::ldexp(float(man), -24);
  return sign ? -magnitude : magnitude;
}

// Rounds |x| (finite, >= 0) to an integer count of `quantum` units, ties to even.
// Used for the subnormal ranges, where values are multiples of one fixed quantum.
static uint32_t round_to_quantum(float magnitude, int quantum_exp) {
  return uint32_t(std::nearbyint(std::ldexp(magnitude, -quantum_exp)));  // FE_TONEAREST default
}

f16 to_f16(float x) {
  const uint32_t u = float_bits(x);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u)};  // NaN
  if (abs >= 0x47800000u) {
    // |x| >= 65536 is inf after rounding; values in [65520, 65536) also round to inf (below).
    return f16{uint16_t(sign | 0x7c00u)};
  }
  if (abs < 0x38800000u) {  // below 2^-14: f16 subnormal range, quantum 2^-24
    return f16{uint16_t(sign | round_to_quantum(bits_float(abs), -24))};  // may carry to 0x400
  }
  // Normal: drop 13 mantissa bits with round-to-nearest-even; a carry may reach inf, correctly.
  uint32_t rebased = abs - (112u << 23);
  rebased += 0xfffu + ((rebased >> 13) & 1u);
  return f16{uint16_t(sign | (rebased >> 13))};
}

float to_float(f8e4m3 x) {
  const bool negative = x.bits & 0x80u;
  const uint32_t exp = (x.bits >> 3) & 0xfu;
  const uint32_t man = x.bits & 0x7u;
  float magnitude;
  if (exp == 0xf && man == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    magnitude = std::ldexp(float(man), -9);  // subnormal: man * 2^-9
  } else {
    magnitude = std::ldexp(float(8 + man), int(exp) - 10);  // 1.man * 2^(exp-7)
  }
  return negative ? -magnitude : magnitude;
}

f8e4m3 to_f8e4m3(float x) {
  const uint32_t u = float_bits(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f8e4m3{uint8_t(sign | 0x7fu)};  // NaN
  if (abs >= 0x43e00000u) return f8e4m3{uint8_t(sign | 0x7eu)};  // >= 448 (and inf): saturate
  if (abs < 0x3c800000u) {  // below 2^-6: subnormal range, quantum 2^-9
    return f8e4m3{uint8_t(sign | round_to_quantum(bits_float(abs), -9))};  // may carry to 0x08
  }
  // Normal: rebase the exponent (bias 127 -> 7), drop 20 mantissa bits, ties to even.
  uint32_t rebased = abs - (120u << 23);
  rebased += 0x7ffffu + ((rebased >> 20) & 1u);
  const uint32_t bits = rebased >> 20;
  return f8e4m3{uint8_t(sign | (bits > 0x7eu ? 0x7eu : bits))};  // 448 < |x| rounds: saturate
}

}  // namespace pmoe
