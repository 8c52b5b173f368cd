// Combine's reduction: out[h] = sum_j weights[j] * rows[j][h], in f32, in j order, rounded once
// (to nearest even) to the output type. Rows stream through one after another into an f32
// accumulator row, which the prefetchers follow well.
//
// Compiled twice (AVX2 and baseline x86-64) and picked at load time, so one binary runs
// everywhere and uses wide vectors where they exist. Multiplies and adds stay separate
// (-ffp-contract=off; AVX2 has no FMA): both versions give the same bits as the plain loop.
#pragma once

#include <cstdint>

#include "pmoe/dtype.hpp"

namespace pmoe::cpu {

// `rows` holds n pointers to rows of H elements; out has H elements.
void weighted_sum(float* out, const float* const* rows, const float* weights, int n, int64_t H);
void weighted_sum(float* out, const bf16* const* rows, const float* weights, int n, int64_t H);
void weighted_sum(float* out, const f16* const* rows, const float* weights, int n, int64_t H);
void weighted_sum(bf16* out, const float* const* rows, const float* weights, int n, int64_t H);
void weighted_sum(bf16* out, const bf16* const* rows, const float* weights, int n, int64_t H);
void weighted_sum(bf16* out, const f16* const* rows, const float* weights, int n, int64_t H);
void weighted_sum(f16* out, const float* const* rows, const float* weights, int n, int64_t H);
void weighted_sum(f16* out, const bf16* const* rows, const float* weights, int n, int64_t H);
void weighted_sum(f16* out, const f16* const* rows, const float* weights, int n, int64_t H);

}  // namespace pmoe::cpu
