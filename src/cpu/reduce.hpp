// The inner loops of combine's reduction, y[t] = sum_j w_j * row_j, in f32 and in j order.
// Compiled twice (AVX2 and baseline x86-64) and picked at load time, so one binary runs
// everywhere and uses wide vectors where they exist. Multiplies and adds stay separate
// (-ffp-contract=off; AVX2 has no FMA): results are bit-identical in both versions.
#pragma once

#include <cstdint>

#include "pmoe/dtype.hpp"

namespace pmoe::cpu {

// acc[i] += w * float(row[i]) for i < n.
void accumulate(float* acc, const float* row, float w, int64_t n);
void accumulate(float* acc, const bf16* row, float w, int64_t n);
void accumulate(float* acc, const f16* row, float w, int64_t n);

// out[i] = round-to-nearest-even(acc[i]) for i < n.
void store(float* out, const float* acc, int64_t n);
void store(bf16* out, const float* acc, int64_t n);
void store(f16* out, const float* acc, int64_t n);

}  // namespace pmoe::cpu
