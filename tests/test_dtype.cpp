// Conversions are checked against independent references: the compiler's _Float16 for f16, and
// a brute-force nearest-value search (ties to the even code) for bf16 and f8 e4m3.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "pmoe/dtype.hpp"
#include "pmoe/error.hpp"

namespace pmoe {
namespace {

// Floats spread over every exponent, both signs, plus the exact midpoints that test ties.
std::vector<float> probe_floats(int count) {
  std::mt19937 gen(42);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> out;
  for (int i = 0; i < count; ++i) out.push_back(bits_float(bits(gen) & 0xffffffffu));
  for (float v : {0.0f, -0.0f, 1.0f, -1.0f, 448.0f, 449.0f, 464.0f, 1e-10f, 65504.0f, 65520.0f,
                  65519.99f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min()})
    out.push_back(v);
  return out;
}

// The code among `codes` nearest to x (|difference| in double), ties to the even code.
template <typename Decode>
uint32_t nearest_code(float x, const std::vector<uint32_t>& codes, Decode decode) {
  uint32_t best = codes[0];
  double best_err = std::abs(double(decode(best)) - double(x));
  for (uint32_t c : codes) {
    const double err = std::abs(double(decode(c)) - double(x));
    if (err < best_err || (err == best_err && (c & 1u) == 0 && (best & 1u) == 1)) {
      best = c;
      best_err = err;
    }
  }
  return best;
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4);
  EXPECT_EQ(dtype_size(DType::bf16), 2);
  EXPECT_EQ(dtype_size(DType::f8e4m3), 1);
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("f8e4m3"), DType::f8e4m3);
  try {
    parse_dtype("f64");
    FAIL() << "parse_dtype accepted f64";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'f64'"), std::string::npos);
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  for (float x : probe_floats(20000)) {
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(to_float(to_bf16(x))));
      continue;
    }
    if (std::isinf(x)) {
      EXPECT_EQ(to_bf16(x).bits, float_bits(x) >> 16) << x;  // infinities stay infinite
      continue;
    }
    if (std::abs(x) > 3.0e38f) continue;  // near bf16's max the upper neighbour is infinity
    const uint32_t down = float_bits(x) >> 16, up = down + 1;
    const uint32_t want = nearest_code(x, {down, up}, [](uint32_t c) {
      return to_float(bf16{uint16_t(c)});
    });
    EXPECT_EQ(to_bf16(x).bits, want) << x;
  }
}

TEST(DType, F16DecodesEveryCodeLikeTheCompiler) {
  for (uint32_t c = 0; c < 0x10000; ++c) {
    _Float16 h;
    const uint16_t bits = uint16_t(c);
    std::memcpy(&h, &bits, 2);
    const float want = float(h), got = to_float(f16{bits});
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(float_bits(got), float_bits(want)) << c;
    }
  }
}

TEST(DType, F16EncodesLikeTheCompiler) {
  for (float x : probe_floats(200000)) {
    const _Float16 h = _Float16(x);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    const uint16_t got = to_f16(x).bits;
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(to_float(f16{got})));
    } else {
      EXPECT_EQ(got, want) << x;
    }
  }
  // Every subnormal and normal midpoint of the lower range, too.
  for (uint32_t c = 0; c < 0x7bff; ++c) {
    const float mid = 0.5f * (to_float(f16{uint16_t(c)}) + to_float(f16{uint16_t(c + 1)}));
    const _Float16 h = _Float16(mid);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    EXPECT_EQ(to_f16(mid).bits, want) << mid;
  }
}

TEST(DType, F8E4M3DecodesKnownValues) {
  EXPECT_EQ(to_float(f8e4m3{0x00}), 0.0f);
  EXPECT_EQ(to_float(f8e4m3{0x01}), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(to_float(f8e4m3{0x07}), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(to_float(f8e4m3{0x08}), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(to_float(f8e4m3{0x38}), 1.0f);
  EXPECT_EQ(to_float(f8e4m3{0x7e}), 448.0f);
  EXPECT_EQ(to_float(f8e4m3{0xfe}), -448.0f);
  EXPECT_TRUE(std::isnan(to_float(f8e4m3{0x7f})));
  EXPECT_TRUE(std::isnan(to_float(f8e4m3{0xff})));
}

TEST(DType, F8E4M3RoundsToNearestEvenAndSaturates) {
  std::vector<uint32_t> magnitudes;  // every finite non-negative code
  for (uint32_t c = 0; c <= 0x7e; ++c) magnitudes.push_back(c);
  auto decode = [](uint32_t c) { return to_float(f8e4m3{uint8_t(c)}); };

  std::vector<float> probes;
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> wide(-600.0f, 600.0f), narrow(-0.05f, 0.05f);
  for (int i = 0; i < 20000; ++i) probes.push_back(wide(gen)), probes.push_back(narrow(gen));
  for (uint32_t c = 0; c < 0x7e; ++c) probes.push_back(0.5f * (decode(c) + decode(c + 1)));
  for (uint32_t c = 0; c <= 0x7e; ++c) probes.push_back(decode(c));

  for (float x : probes) {
    const float magnitude = std::abs(x);
    const uint32_t want = magnitude >= 448.0f ? 0x7e : nearest_code(magnitude, magnitudes, decode);
    const uint8_t got = to_f8e4m3(x).bits;
    EXPECT_EQ(got & 0x7fu, want) << x;
    if (x != 0.0f) {
      EXPECT_EQ(bool(got & 0x80u), x < 0) << x;
    }
  }
  EXPECT_EQ(to_f8e4m3(std::numeric_limits<float>::infinity()).bits, 0x7e);
  EXPECT_EQ(to_f8e4m3(-1e30f).bits, 0xfe);
  EXPECT_EQ(to_f8e4m3(std::nanf("")).bits & 0x7f, 0x7f);
}

}  // namespace
}  // namespace pmoe
