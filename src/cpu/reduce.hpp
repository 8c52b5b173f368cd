// Combine's reduction: out[h] = sum_j weights[j] * rows[j][h], in f32, in j order, rounded once
// (to nearest even) to the output type.
//
// bf16 rows into bf16 or f32 go through an AVX2 kernel that keeps the sums in registers, where
// the CPU has AVX2; every other case (and every CPU) has a portable path, compiled for AVX2 and
// baseline x86-64 and picked at load time. Multiplies and adds stay separate (-ffp-contract=off;
// the kernels use no FMA): every path gives the bits of the plain loop.
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
