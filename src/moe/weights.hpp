// The MoE weight generator: a counter-based hash of (seed, tensor, expert, row, column), so any
// rank can build any slice of any weight without communication, and the plain reference can
// rebuild it element by element (moe_weight() in pmoe/moe.hpp is the same function).
#pragma once

#include <cmath>
#include <cstdint>

#include "pmoe/moe.hpp"

namespace pmoe::detail {

// splitmix64's finaliser over a mix of the counters.
inline uint64_t weight_hash(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t z = seed ^ (a * 0x9e3779b97f4a7c15ull) ^ (b * 0xc2b2ae3d27d4eb4full) ^
               (c * 0x165667b19e3779f9ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Rows of the tensor: the fan-in that scales it.
int64_t weight_rows(const MoeConfig& config, MoeTensor tensor);

// out[(r - row_begin) * ld + (c - col_begin)] = moe_weight(config, tensor, expert, r, c) for r in
// [row_begin, row_end), c in [col_begin, col_end).
void fill_weights(const MoeConfig& config, MoeTensor tensor, int expert, int64_t row_begin,
                  int64_t row_end, int64_t col_begin, int64_t col_end, float* out, int64_t ld);

}  // namespace pmoe::detail
