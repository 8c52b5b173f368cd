// The MoE computation over the tokens this rank holds, with this rank's slice of every expert:
// route, group the (token, slot) pairs by expert, gather each expert's rows, run the expert over
// them in one pass, then sum each token's rows with its router weights in slot order, in f32.
// SimpleMoe runs it with whole experts; TpMoe with one hidden slice of each, so its sums are
// partial and an all-reduce completes them.
//
//   pair p = t * k + j                    token t, top-k slot j
//   grouped rows of expert e              [offsets[e], offsets[e + 1]), pairs in token order
//   gathered   [rows of one expert, H] f32    the expert's input rows, reused expert by expert
//   expert_out [m * k, O] f32                 row i holds the output of grouped row i
#pragma once

#include <vector>

#include "moe/rows.hpp"
#include "pmoe/moe.hpp"

namespace pmoe::detail {

class LocalMoe {
 public:
  // Experts [0, E) restricted to hidden columns [ffn_begin, ffn_end); up to max_tokens tokens.
  LocalMoe(const MoeConfig& config, int max_tokens, int ffn_begin, int ffn_end);

  // x [m, H] config.dtype, contiguous, m <= max_tokens (the caller validated it). Writes
  // y_acc[t * O + o] = sum over j of weight[t, j] * slice-output of expert[t, j] for token t.
  // Sets stats' tokens, expert_rows, expert_flops, router_flops, route_s, experts_s, combine_s.
  void forward(const Tensor& x, float* y_acc, MoeStats& stats);

  size_t weight_bytes() const { return router_.weight_bytes() + experts_.weight_bytes(); }
  size_t workspace_bytes() const;

 private:
  void group_pairs(int m);

  MoeConfig config_;
  int max_tokens_;
  Router router_;
  Experts experts_;
  Buffer x_f32_;                      // [max_tokens, H] f32, when dtype is bf16
  Buffer indices_;                    // [max_tokens, k] i32
  Buffer weights_;                    // [max_tokens, k] f32
  Buffer gathered_;                   // [max_tokens, H] f32
  Buffer expert_out_;                 // [max_tokens * k, O] f32
  std::vector<int32_t> offsets_;      // [E + 1]
  std::vector<int32_t> pair_of_row_;  // [m * k]
  std::vector<int32_t> row_of_pair_;  // [m * k]
};

}  // namespace pmoe::detail
