#include "cpu/reduce.hpp"

#include <algorithm>
#include <type_traits>

// Sanitizer builds take the portable path: their instrumented ifunc resolvers run before the
// sanitizer runtime is up (ThreadSanitizer crashes at load).
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define PMOE_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#define PMOE_HAVE_AVX2_KERNEL 1
#include <immintrin.h>
#else
#define PMOE_VECTOR_CLONES
#define PMOE_HAVE_AVX2_KERNEL 0
#endif
#define PMOE_ALWAYS_INLINE __attribute__((always_inline)) inline

namespace pmoe::cpu {
namespace {

// Loads that vectorise: bf16 is the high half of an f32; f16 goes through the exact converter.
PMOE_ALWAYS_INLINE float load(const float* p, int64_t i) { return p[i]; }
PMOE_ALWAYS_INLINE float load(const bf16* p, int64_t i) {
  return bits_float(uint32_t(reinterpret_cast<const uint16_t*>(p)[i]) << 16);
}
PMOE_ALWAYS_INLINE float load(const f16* p, int64_t i) { return to_float(p[i]); }

PMOE_ALWAYS_INLINE void put(float* p, int64_t i, float v) { p[i] = v; }
PMOE_ALWAYS_INLINE void put(bf16* p, int64_t i, float v) {
  // to_bf16 without a branch, so that it vectorises; NaN stays a quiet NaN.
  const uint32_t u = float_bits(v);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  reinterpret_cast<uint16_t*>(p)[i] = uint16_t(nan ? ((u >> 16) | 0x40u) : rounded);
}
PMOE_ALWAYS_INLINE void put(f16* p, int64_t i, float v) { p[i] = to_f16(v); }

// One pass per row over an f32 accumulator: the portable path, for every dtype pair.
template <typename In>
PMOE_VECTOR_CLONES void accumulate_row(float* acc, const In* row, float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += w * load(row, i);
}

template <typename Out>
PMOE_VECTOR_CLONES void store_row(Out* out, const float* acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) put(out, i, acc[i]);
}

// H is cut into pieces whose accumulator (8 KiB) stays in L1 while the rows stream past.
template <typename Out, typename In>
void weighted_sum_portable(Out* out, const In* const* rows, const float* weights, int n,
                           int64_t H) {
  constexpr int64_t kPiece = 2048;
  float acc[kPiece];
  for (int64_t h = 0; h < H; h += kPiece) {
    const int64_t len = std::min(kPiece, H - h);
    std::fill(acc, acc + len, 0.0f);
    for (int j = 0; j < n; ++j) accumulate_row(acc, rows[j] + h, weights[j], len);
    store_row(out + h, acc, len);
  }
}

// One element at a time, for the tail the vector kernel leaves.
template <typename Out, typename In>
void weighted_sum_scalar(Out* out, const In* const* rows, const float* weights, int n,
                         int64_t from, int64_t H) {
  for (int64_t h = from; h < H; ++h) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc += weights[j] * load(rows[j], h);
    put(out, h, acc);
  }
}

#if PMOE_HAVE_AVX2_KERNEL
// bf16 rows, the case combine meets most, with the accumulators in registers: 64 elements (four
// 32-byte loads per row) are summed over all n rows before the next 64. The shuffle that widens
// bf16 to f32 would bound this loop, so there is none: a 32-bit lane holds elements 2i (low half)
// and 2i+1 (high half), `lane << 16` is element 2i as an f32 and `lane & 0xffff0000` is 2i+1, and
// the even and odd sums live in separate registers until the store puts them back together.
// Each element still sees w * x then + in j order in f32, so the bits equal the portable path's.
// Reading the n rows side by side is what the prefetchers must follow; measured on a Zen 3 VM it
// halves the time of the accumulator-in-L1 path (which is bound by its own loads and stores).
constexpr int64_t kAvx2Block = 64;

struct Avx2Sums {
  __m256 even[4], odd[4];
};

__attribute__((target("avx2"))) inline Avx2Sums sum_block_avx2(const bf16* const* rows,
                                                                const float* weights, int n,
                                                                int64_t h) {
  const __m256i high_half = _mm256_set1_epi32(int32_t(0xffff0000u));
  Avx2Sums s;
  for (int b = 0; b < 4; ++b) s.even[b] = s.odd[b] = _mm256_setzero_ps();
  for (int j = 0; j < n; ++j) {
    const auto* row = reinterpret_cast<const __m256i*>(rows[j] + h);
    const __m256 w = _mm256_set1_ps(weights[j]);
    for (int b = 0; b < 4; ++b) {
      const __m256i lanes = _mm256_loadu_si256(row + b);
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(lanes, 16));
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(lanes, high_half));
      s.even[b] = _mm256_add_ps(s.even[b], _mm256_mul_ps(w, even));
      s.odd[b] = _mm256_add_ps(s.odd[b], _mm256_mul_ps(w, odd));
    }
  }
  return s;
}

// put(bf16*) on eight lanes, leaving the rounded bf16 in the high half of each lane.
__attribute__((target("avx2"))) inline __m256i round_to_bf16_high(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  const __m256i magnitude = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

__attribute__((target("avx2"))) inline void store_block_avx2(bf16* out, const Avx2Sums& s) {
  const __m256i high_half = _mm256_set1_epi32(int32_t(0xffff0000u));
  auto* dst = reinterpret_cast<__m256i*>(out);
  for (int b = 0; b < 4; ++b) {
    const __m256i even = _mm256_srli_epi32(round_to_bf16_high(s.even[b]), 16);
    const __m256i odd = _mm256_and_si256(round_to_bf16_high(s.odd[b]), high_half);
    _mm256_storeu_si256(dst + b, _mm256_or_si256(even, odd));
  }
}

__attribute__((target("avx2"))) inline void store_block_avx2(float* out, const Avx2Sums& s) {
  for (int b = 0; b < 4; ++b) {
    const __m256 low = _mm256_unpacklo_ps(s.even[b], s.odd[b]);   // 0 1 2 3 | 8 9 10 11
    const __m256 high = _mm256_unpackhi_ps(s.even[b], s.odd[b]);  // 4 5 6 7 | 12 13 14 15
    _mm256_storeu_ps(out + 16 * b, _mm256_permute2f128_ps(low, high, 0x20));
    _mm256_storeu_ps(out + 16 * b + 8, _mm256_permute2f128_ps(low, high, 0x31));
  }
}

template <typename Out>
__attribute__((target("avx2"))) void weighted_sum_avx2(Out* out, const bf16* const* rows,
                                                       const float* weights, int n, int64_t H) {
  int64_t h = 0;
  for (; h + kAvx2Block <= H; h += kAvx2Block)
    store_block_avx2(out + h, sum_block_avx2(rows, weights, n, h));
  weighted_sum_scalar(out, rows, weights, n, h, H);
}

bool have_avx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}
#endif

template <typename Out, typename In>
void weighted_sum_impl(Out* out, const In* const* rows, const float* weights, int n, int64_t H) {
#if PMOE_HAVE_AVX2_KERNEL
  if constexpr (std::is_same_v<In, bf16> && !std::is_same_v<Out, f16>) {
    if (have_avx2()) return weighted_sum_avx2(out, rows, weights, n, H);
  }
#endif
  weighted_sum_portable(out, rows, weights, n, H);
}

}  // namespace

#define PMOE_WEIGHTED_SUM(Out, In)                                                            \
  void weighted_sum(Out* out, const In* const* rows, const float* weights, \
                                       int n, int64_t H) {                                    \
    weighted_sum_impl(out, rows, weights, n, H);                                              \
  }
PMOE_WEIGHTED_SUM(float, float)
PMOE_WEIGHTED_SUM(float, bf16)
PMOE_WEIGHTED_SUM(float, f16)
PMOE_WEIGHTED_SUM(bf16, float)
PMOE_WEIGHTED_SUM(bf16, bf16)
PMOE_WEIGHTED_SUM(bf16, f16)
PMOE_WEIGHTED_SUM(f16, float)
PMOE_WEIGHTED_SUM(f16, bf16)
PMOE_WEIGHTED_SUM(f16, f16)
#undef PMOE_WEIGHTED_SUM

}  // namespace pmoe::cpu
