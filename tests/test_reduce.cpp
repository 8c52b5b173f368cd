// Combine's reduction (src/cpu/reduce.hpp) against the plain loop written here: f32 sums in j
// order, rounded once with the dtype conversions test_dtype checks. Lengths around the vector
// kernel's 64-element blocks, rows that start at odd element offsets, no rows at all, and row
// values drawn from every bit pattern (infinities, NaNs, subnormals) so rounding and NaN
// handling are compared too. The ASan build (`make test-asan`) runs the portable path.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/reduce.hpp"
#include "pmoe/dtype.hpp"

namespace pmoe {
namespace {

template <typename T> T from_bits(uint32_t u);
template <> float from_bits<float>(uint32_t u) { return bits_float(u); }
template <> bf16 from_bits<bf16>(uint32_t u) { return bf16{uint16_t(u)}; }
template <> f16 from_bits<f16>(uint32_t u) { return f16{uint16_t(u)}; }

template <typename T> uint32_t to_bits(T x);
template <> uint32_t to_bits<float>(float x) { return float_bits(x); }
template <> uint32_t to_bits<bf16>(bf16 x) { return x.bits; }
template <> uint32_t to_bits<f16>(f16 x) { return x.bits; }

template <typename Out, typename In>
void check_against_plain_loop(uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<uint32_t> bits;
  std::uniform_real_distribution<float> weight(-2.0f, 2.0f);
  // Mostly ordinary values (so that sums are not all NaN), one element in 64 any bit pattern.
  auto value = [&] {
    const uint32_t b = bits(gen);
    if (b % 64 == 0) return from_bits<In>(bits(gen));
    return from_float<In>(weight(gen));
  };
  for (int64_t H : {0, 1, 2, 3, 63, 64, 65, 127, 128, 130, 200, 7168 + 31}) {
    for (int n : {0, 1, 2, 8, 9}) {
      // Row j starts j + 1 elements into its own slice of the pool: odd offsets, no alignment.
      std::vector<In> pool(size_t(n) * size_t(H + 16));
      for (In& x : pool) x = value();
      std::vector<const In*> rows;
      std::vector<float> weights;
      for (int j = 0; j < n; ++j) {
        rows.push_back(pool.data() + size_t(j) * size_t(H + 16) + size_t(j) + 1);
        weights.push_back(j == 2 ? 0.0f : weight(gen));
      }
      std::vector<Out> got(size_t(H) + 1, from_bits<Out>(0x5a5a));
      cpu::weighted_sum(got.data(), rows.data(), weights.data(), n, H);
      for (int64_t h = 0; h < H; ++h) {
        float sum = 0.0f;
        for (int j = 0; j < n; ++j) sum += weights[size_t(j)] * to_float(rows[size_t(j)][h]);
        const uint32_t want = to_bits(from_float<Out>(sum));
        ASSERT_EQ(to_bits(got[size_t(h)]), want)
            << "H=" << H << " n=" << n << " element " << h << " (sum " << sum << ")";
      }
      ASSERT_EQ(to_bits(got[size_t(H)]), to_bits(from_bits<Out>(0x5a5a)))
          << "H=" << H << " n=" << n << ": wrote past the end of the output";
    }
  }
}

TEST(WeightedSum, Bf16RowsIntoBf16) { check_against_plain_loop<bf16, bf16>(1); }
TEST(WeightedSum, Bf16RowsIntoF32) { check_against_plain_loop<float, bf16>(2); }
TEST(WeightedSum, Bf16RowsIntoF16) { check_against_plain_loop<f16, bf16>(3); }
TEST(WeightedSum, F32RowsIntoBf16) { check_against_plain_loop<bf16, float>(4); }
TEST(WeightedSum, F16RowsIntoF32) { check_against_plain_loop<float, f16>(5); }

// Sums that land exactly halfway between two bf16 values round to the even one, in every lane.
TEST(WeightedSum, Bf16TiesRoundToEven) {
  const int64_t H = 128;
  std::vector<bf16> a(H), b(H);
  for (int64_t h = 0; h < H; ++h) {
    // 1 + m * 2^-7 plus 2^-8: halfway between two bf16 neighbours; m's parity picks the winner.
    a[size_t(h)] = to_bf16(1.0f + float(h % 128) / 128.0f);
    b[size_t(h)] = to_bf16(1.0f / 256.0f);
  }
  const bf16* rows[2] = {a.data(), b.data()};
  const float weights[2] = {1.0f, 1.0f};
  std::vector<bf16> got(H);
  cpu::weighted_sum(got.data(), rows, weights, 2, H);
  for (int64_t h = 0; h < H; ++h) {
    const float sum = to_float(a[size_t(h)]) + to_float(b[size_t(h)]);
    ASSERT_EQ(got[size_t(h)].bits, to_bf16(sum).bits) << "element " << h;
    ASSERT_EQ(got[size_t(h)].bits & 1u, 0u) << "element " << h << " did not round to even";
  }
}

}  // namespace
}  // namespace pmoe
