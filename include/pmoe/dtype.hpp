// Element types and their conversions. Every narrowing conversion rounds to nearest, ties to even;
// f8 e4m3 (the "fn" variant: no infinities, NaN = S.1111.111) saturates to +-448.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace pmoe {

// i32 and i64 are for indices (torch.topk returns int64).
enum class DType : uint8_t { f32, f16, bf16, f8e4m3, i32, i64 };

// Bytes per element.
constexpr int dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f8e4m3: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f8e4m3: return "f8e4m3";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

// The name NumPy and PyTorch give the type ("float32", "bfloat16", "int64"), for error messages
// that Python users read.
constexpr std::string_view dtype_array_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::f8e4m3: return "float8_e4m3fn";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
  }
  return "?";
}

// Parses "f32", "bf16", ... ; throws pmoe::Error on an unknown name.
DType parse_dtype(std::string_view name);

// The narrow float types are plain bit containers; arithmetic happens in float.
struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };
struct f8e4m3 { uint8_t bits; };

inline uint32_t float_bits(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
inline float bits_float(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }

inline float to_float(float x) { return x; }
inline float to_float(bf16 x) { return bits_float(uint32_t{x.bits} << 16); }
float to_float(f16 x);
float to_float(f8e4m3 x);

// Round-to-nearest-even conversions from float.
inline bf16 to_bf16(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}
f16 to_f16(float x);
f8e4m3 to_f8e4m3(float x);

// from_float<T>(x): the conversion to T by type, for code templated on the element type.
template <typename T> T from_float(float x);
template <> inline float from_float<float>(float x) { return x; }
template <> inline bf16 from_float<bf16>(float x) { return to_bf16(x); }
template <> inline f16 from_float<f16>(float x) { return to_f16(x); }
template <> inline f8e4m3 from_float<f8e4m3>(float x) { return to_f8e4m3(x); }

// Calls fn(T{}) with T the C++ element type of a floating dtype (f32, f16, bf16, f8e4m3):
// the one place where a runtime dtype becomes a template parameter.
template <typename Fn>
decltype(auto) visit_float_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn(float{});
    case DType::f16: return fn(f16{});
    case DType::bf16: return fn(bf16{});
    case DType::f8e4m3: return fn(f8e4m3{});
    default: break;
  }
  return fn(float{});  // unreachable for validated input; callers check the dtype first
}

}  // namespace pmoe
