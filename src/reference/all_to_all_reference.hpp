// The plain reference for AllToAll, written for clarity: one process, plain loops, no buffers
// shared with the op. Tests and pmoe-bench check every result of the op against it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/workload.hpp"

namespace pmoe::reference {

// What one rank must hold after dispatch.
struct DispatchExpected {
  std::vector<int32_t> counts;                  // [E_local]
  std::vector<std::vector<std::byte>> rows;     // per local expert: its rows, concatenated
  std::vector<std::vector<std::byte>> scales;   // per local expert: their scales (f8 only)
};

// Every token of every rank, in (source rank, token) order, lands at each local expert of
// `rank` it chose. `all[s]` are rank s's inputs.
DispatchExpected reference_dispatch(const AllToAllConfig& config, int world_size, int rank,
                                    const std::vector<AllToAllInputs>& all);

// "" when dispatch's outputs match `expected` and every row past the counts still holds
// `sentinel` bytes; otherwise a description of the first difference.
std::string compare_dispatch(const AllToAllConfig& config, int world_size,
                             const DispatchExpected& expected, const Tensor& expert_num_tokens,
                             const Tensor& expert_x, const Tensor& expert_x_scale,
                             uint8_t sentinel);

// The stand-in for expert `expert` in tests: v -> v * (1 + expert / 8), in f32.
float expert_fn(float v, int expert);

// Element h of a token row as a float: f8 values times their block scale.
float token_value(const AllToAllConfig& config, const std::byte* row, const float* row_scales,
                  int h);

// One stand-in expert output row: out[h] = expert_fn(token_value(row, h), expert), rounded to
// `out_dtype`.
void fake_expert_row(const AllToAllConfig& config, const std::byte* row, const float* row_scales,
                     int expert, DType out_dtype, void* out);

// Runs expert_fn over the received rows of `rank`'s local experts into expert_y (its dtype);
// rows past the counts are left as they are.
void run_fake_experts(const AllToAllConfig& config, int world_size, int rank,
                      const Tensor& expert_num_tokens, const Tensor& expert_x,
                      const Tensor& expert_x_scale, const Tensor& expert_y);

// The y that combine must give the rank whose inputs are `mine`, when the experts are
// run_fake_experts writing `expert_y_dtype`.
Buffer reference_combine(const AllToAllConfig& config, const AllToAllInputs& mine,
                         DType expert_y_dtype);

// "" when the two tensors hold the same bytes; else the first differing element.
std::string compare_bytes(const char* what, const Tensor& got, const Tensor& expected);

}  // namespace pmoe::reference
