// Where AllToAll's data sits in each rank's symmetric region (CPU backend). All offsets are
// 64-byte aligned so that copies run on whole cache lines.
//
//   rank r's region
//   +-----------------------------------------------------------------------------+
//   | dispatch area: one block per source rank s = 0 .. W-1                       |
//   |   block s: | count (i32, padded to 64 B) | token slot 0 | ... | slot max-1 |   |
//   |   token slot: | header | payload [H] in_dtype | scales [H / scale_block] f32 |
//   |   header: i32 token index at s, i32 n, then n pairs (local expert, top-k slot j)
//   +-----------------------------------------------------------------------------+
//   | combine area: r's own tokens, one row per (token t, top-k slot j):           |
//   |   row (t, j) at t * k + j, H elements of expert_y's dtype (room for f32)    |
//   +-----------------------------------------------------------------------------+
//   signals: slot s = dispatch data from s is complete; slot W + s = combine rows from s
//
// Source s writes block s of every destination rank: a token crosses to a rank once, with the
// list of that rank's experts it chose. Rank r writes combine rows into the source's region.
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
        payload_bytes(align64(size_t(config.hidden_dim) * dtype_size(config.in_dtype))),
        scale_bytes(align64(sizeof(float) * size_t(config.scales_per_token()))),
        token_stride(header_bytes + payload_bytes + scale_bytes),
        source_block(64 + size_t(max_tokens) * token_stride),
        combine_row(align64(size_t(config.hidden_dim) * sizeof(float))),
        combine_offset(size_t(world_size) * source_block),
        total_bytes(combine_offset + size_t(max_tokens) * top_k * combine_row) {}

  size_t count_offset(int source) const { return size_t(source) * source_block; }
  size_t token_offset(int source, int slot) const {
    return count_offset(source) + 64 + size_t(slot) * token_stride;
  }
  size_t payload_offset(int source, int slot) const {
    return token_offset(source, slot) + header_bytes;
  }
  size_t scale_offset(int source, int slot) const {
    return payload_offset(source, slot) + payload_bytes;
  }
  size_t combine_row_offset(int token, int slot) const {
    return combine_offset + (size_t(token) * top_k + slot) * combine_row;
  }
  int dispatch_signal(int source) const { return source; }
  int combine_signal(int source) const { return world_size + source; }
  int signal_slots() const { return 2 * world_size; }

  int world_size;
  int max_tokens;
  int top_k;
  int max_pairs;  // most experts of one rank that one token can choose
  size_t header_bytes, payload_bytes, scale_bytes, token_stride, source_block;
  size_t combine_row, combine_offset, total_bytes;
};

}  // namespace pmoe::detail
