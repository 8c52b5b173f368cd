#include "cpu/reduce.hpp"

#include <algorithm>

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define PMOE_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PMOE_VECTOR_CLONES
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

// One pass per row over an f32 accumulator: rows stream through memory contiguously, which the
// hardware prefetchers follow (interleaving the k rows in register blocks measured 2x slower).
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
void weighted_sum_impl(Out* out, const In* const* rows, const float* weights, int n, int64_t H) {
  constexpr int64_t kPiece = 2048;
  float acc[kPiece];
  for (int64_t h = 0; h < H; h += kPiece) {
    const int64_t len = std::min(kPiece, H - h);
    std::fill(acc, acc + len, 0.0f);
    for (int j = 0; j < n; ++j) accumulate_row(acc, rows[j] + h, weights[j], len);
    store_row(out + h, acc, len);
  }
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
