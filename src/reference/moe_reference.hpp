// The plain reference for the MoE layers, written for clarity: one token at a time, plain loops
// in double, every weight rebuilt element by element from moe_weight(). Tests and pmoe-bench
// check SimpleMoe, TpMoe and EpMoe against it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pmoe/moe.hpp"

namespace pmoe::reference {

// A batch of layer inputs [tokens, hidden_dim] config.dtype: x[t, h] uniform in [-1, 1) from
// (seed, t, h), rounded to the dtype. Every rank builds the same batch without communicating.
Buffer make_moe_input(const MoeConfig& config, int tokens, uint64_t seed);

// Two logits closer than this are a tie that f32 rounding may break either way, so a token whose
// k-th and (k+1)-th logits are this close may go to either expert in a correct layer.
constexpr double kTieGap = 1e-4;

struct MoeExpected {
  std::vector<int> rows;        // the token rows of the batch computed
  std::vector<double> y;        // [rows.size(), out_dim]
  std::vector<char> ambiguous;  // per row: a top-k tie (kTieGap); such rows are not compared
  // [rows.size(), out_dim]: per output, the magnitude of the terms that make it (the same sums
  // over |x|, |W| and |act|): what its error is relative to, so outputs that cancel are judged
  // by what was summed, not by how little is left.
  std::vector<double> magnitude;
};

// The layer output for tokens `rows` of x [B, hidden_dim] (config.dtype), in double:
// y = sum over the top-k experts of softmax(top-k logits) * act(x W1_e) W2_e.
MoeExpected reference_moe(const MoeConfig& config, const Tensor& x, const std::vector<int>& rows);

// Every row of a batch of `tokens`.
std::vector<int> all_rows(int tokens);

// The error a layer's output may have, relative to the magnitude of its terms: 1e-5 for f32,
// 1e-2 for bf16 (8-bit mantissa: weights, hidden values and outputs each rounded once, each
// moving an output by at most 2^-9 of that magnitude).
double moe_tolerance(DType dtype);

struct MoeComparison {
  std::string error;     // "" when every compared row is within the tolerance
  double max_error = 0;  // max |got - expected| / expected.magnitude over the compared rows
  int compared = 0;      // rows compared
  int skipped = 0;       // rows in range not compared because of a top-k tie
};

// Compares got [n, out_dim] (f32 or bf16), the layer output for batch rows
// [first_row, first_row + n), with every expected row in that range.
MoeComparison compare_moe(const MoeConfig& config, const MoeExpected& expected, const Tensor& got,
                          int first_row, double tolerance);

}  // namespace pmoe::reference
