#include "cpu/reduce.hpp"

#include <cstring>

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define PMOE_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PMOE_VECTOR_CLONES
#endif

namespace pmoe::cpu {

PMOE_VECTOR_CLONES
void accumulate(float* acc, const float* row, float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += w * row[i];
}

PMOE_VECTOR_CLONES
void accumulate(float* acc, const bf16* row, float w, int64_t n) {
  const auto* bits = reinterpret_cast<const uint16_t*>(row);
  for (int64_t i = 0; i < n; ++i) acc[i] += w * bits_float(uint32_t(bits[i]) << 16);
}

void accumulate(float* acc, const f16* row, float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += w * to_float(row[i]);
}

void store(float* out, const float* acc, int64_t n) { std::memcpy(out, acc, size_t(n) * 4); }

PMOE_VECTOR_CLONES
void store(bf16* out, const float* acc, int64_t n) {
  auto* bits = reinterpret_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; ++i) {
    // to_bf16, written branch-free so that it vectorises: NaN keeps a quiet-NaN payload.
    const uint32_t u = float_bits(acc[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    bits[i] = uint16_t(nan ? ((u >> 16) | 0x40u) : rounded);
  }
}

void store(f16* out, const float* acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_f16(acc[i]);
}

}  // namespace pmoe::cpu
