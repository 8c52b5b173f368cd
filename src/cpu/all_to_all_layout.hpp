// Where AllToAll's data sits in each rank's symmetric region (CPU backend). All offsets are
// 64-byte aligned so that copies run on whole cache lines.
//
//   rank r's region
//   +---------------------------------------------------------------------------------+
//   | dispatch area: one block per source rank s = 0 .. W-1                           |
//   |   block s: | count, flags (i32 each, padded to 64 B) | token slot 0 | ... | max-1 |
//   |   token slot: | header | payload [H] in_dtype | scales [H / scale_block] f32 |    |
//   |   header: i32 token index at s, i32 n, then n pairs (local expert, top-k slot j)  |
//   |   flags bit 0: payloads stay in s's input buffer (slots hold headers only)       |
//   +---------------------------------------------------------------------------------+
//   | combine area: r's own tokens, one row per (token t, top-k slot j), at t * k + j,  |
//   |   H elements of expert_y's dtype (room for f32)                                  |
//   | row refs: i32 [max_tokens, k]: the row of (t, j) in its owner's expert output    |
//   |   buffer, read in place, or -1 when the row was copied into the combine area     |
//   | combine dtypes: per owner rank, the DType of its expert_y (64 B each)            |
//   +---------------------------------------------------------------------------------+
//   | in-place buffers (config.in_place_buffers only):                                 |
//   |   input [max_tokens] rows of payload, input scales [max_tokens] rows of scales,  |
//   |   expert output [E_local * W * max_tokens] rows of H out_dtype elements          |
//   +---------------------------------------------------------------------------------+
//   signals: slot s = dispatch data from s is complete; slot W + s = combine rows from s
//
// Source s writes block s of every destination rank: a token crosses to a rank once, with the
// list of that rank's experts it chose. Owner r writes rows (or row refs) into the source's
// combine area.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "pmoe/all_to_all.hpp"

namespace pmoe::detail {

constexpr size_t align64(size_t bytes) { return (bytes + 63) / 64 * 64; }

struct AllToAllLayout {
  AllToAllLayout(const AllToAllConfig& config, int world_size)
      : world_size(world_size),
        max_tokens(config.max_num_tokens),
        top_k(config.experts_per_token),
        max_pairs(std::min(config.experts_per_token, config.num_experts / world_size)),
        header_bytes(align64(sizeof(int32_t) * (2 + 2 * size_t(max_pairs)))),
        payload_bytes(size_t(config.hidden_dim) * dtype_size(config.in_dtype)),
        scale_bytes(sizeof(float) * size_t(config.scales_per_token())),
        token_stride(header_bytes + align64(payload_bytes) + align64(scale_bytes)),
        source_block(64 + size_t(max_tokens) * token_stride),
        combine_row(align64(size_t(config.hidden_dim) * sizeof(float))),
        combine_offset(size_t(world_size) * source_block),
        row_ref_offset(combine_offset + size_t(max_tokens) * top_k * combine_row),
        combine_dtype_offset(row_ref_offset + align64(sizeof(int32_t) * max_tokens * top_k)),
        input_offset(combine_dtype_offset + 64 * size_t(world_size)),
        input_scale_offset(input_offset +
                           (config.in_place_buffers ? align64(max_tokens * payload_bytes) : 0)),
        expert_output_offset(input_scale_offset +
                             (config.in_place_buffers ? align64(max_tokens * scale_bytes) : 0)),
        expert_output_row(size_t(config.hidden_dim) * dtype_size(config.out_dtype)),
        total_bytes(expert_output_offset +
                    (config.in_place_buffers
                         ? align64(size_t(config.num_experts) * max_tokens * expert_output_row)
                         : 0)) {}

  size_t count_offset(int source) const { return size_t(source) * source_block; }
  size_t flags_offset(int source) const { return count_offset(source) + sizeof(int32_t); }
  size_t token_offset(int source, int slot) const {
    return count_offset(source) + 64 + size_t(slot) * token_stride;
  }
  size_t payload_offset(int source, int slot) const {
    return token_offset(source, slot) + header_bytes;
  }
  size_t scale_offset(int source, int slot) const {
    return payload_offset(source, slot) + align64(payload_bytes);
  }
  size_t combine_row_offset(int token, int slot) const {
    return combine_offset + (size_t(token) * top_k + slot) * combine_row;
  }
  size_t row_ref_slot(int token, int slot) const {
    return row_ref_offset + (size_t(token) * top_k + slot) * sizeof(int32_t);
  }
  size_t combine_dtype_slot(int owner) const { return combine_dtype_offset + 64 * size_t(owner); }
  int dispatch_signal(int source) const { return source; }
  int combine_signal(int source) const { return world_size + source; }
  int signal_slots() const { return 2 * world_size; }

  static constexpr int32_t kPayloadInPlace = 1;  // flags bit: payloads stay at the source

  int world_size;
  int max_tokens;
  int top_k;
  int max_pairs;  // most experts of one rank that one token can choose
  size_t header_bytes, payload_bytes, scale_bytes, token_stride, source_block;
  size_t combine_row, combine_offset, row_ref_offset, combine_dtype_offset;
  size_t input_offset, input_scale_offset, expert_output_offset, expert_output_row;
  size_t total_bytes;
};

}  // namespace pmoe::detail
