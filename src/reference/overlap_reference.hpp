// Plain references for AllGatherGemm and GemmReduceScatter, written for clarity, and their
// deterministic inputs.
//
// Inputs are cut from two global operands, A [M, K] and B [K, N], whose every element is a pure
// function of (seed, operand, row, column): any rank can rebuild any other rank's slices, and a
// checker can compute any element of C = A . B without the slices.
//
// The references compute in double from the operands as stored (16-bit values widened exactly).
// Each expected element carries the error the op may make: BLAS's f32 accumulation over K terms,
// plus one rounding of every value the op stores or sends in its dtype.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pmoe/overlap.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe::reference {

enum class Operand : uint8_t { a, b };

// Element (row, col) of the global operand: uniform in [-1, 1), rounded to dtype (f32, bf16 or
// f16).
float operand_value(uint64_t seed, Operand which, int64_t row, int64_t col, DType dtype);
// Fills `t` (2-D, f32, bf16 or f16) with the block of the operand whose top-left is (row0, col0).
void fill_operand(const Tensor& t, uint64_t seed, Operand which, int64_t row0, int64_t col0);

// One rank's A and B, cut from the global operands.
struct OverlapInputs {
  Buffer A, B;
};
// AllGatherGemm: A_r = rows [r M/W, (r+1) M/W) of A; B_r = columns [r N/W, (r+1) N/W) of B.
OverlapInputs make_all_gather_gemm_inputs(const OverlapConfig& config, int world_size, int rank,
                                          uint64_t seed);
// GemmReduceScatter: A_r = columns [r K/W, (r+1) K/W) of A; B_r = the same rows of B.
OverlapInputs make_gemm_reduce_scatter_inputs(const OverlapConfig& config, int world_size, int rank,
                                              uint64_t seed);

// Expected elements of one rank's C at rows x cols (row-major over the two lists).
struct Expected {
  std::vector<int64_t> rows, cols;
  std::vector<double> value, tolerance;
};

// All-gather (the rows of every rank's A, in rank order), then the triple loop with B_r.
// a_parts[s] is rank s's A [M/W, K]; b is this rank's B [K, N/W].
Expected all_gather_gemm_reference(const std::vector<Tensor>& a_parts, const Tensor& b, DType out);
// The triple loop A_s . B_s on every rank s, then the reduce-scatter: rows of block `rank` of
// their sum. a_parts[s] [M, K/W], b_parts[s] [K/W, N].
Expected gemm_reduce_scatter_reference(const std::vector<Tensor>& a_parts,
                                       const std::vector<Tensor>& b_parts, int rank, DType out);

// For sizes where the triple loops take too long (pmoe-bench): the elements of rank's C at
// `rows` x `cols`, summed straight from operand_value(). `gather` picks AllGatherGemm.
Expected sampled_reference(bool gather, const OverlapConfig& config, int world_size, int rank,
                           uint64_t seed, const std::vector<int64_t>& rows,
                           const std::vector<int64_t>& cols);

// "" when every expected element of `got` (2-D, f32, bf16 or f16) is within its tolerance; else
// the number of bad elements and the first few, with their position, value and bound.
std::string compare_close(std::string_view what, const Tensor& got, const Expected& want);

}  // namespace pmoe::reference
