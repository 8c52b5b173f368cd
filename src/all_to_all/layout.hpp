// Where AllToAll's data sits in each rank's symmetric region, for every backend: the CPU backend
// and the CUDA kernels both read every offset from here (the kernels get this struct by value in
// their params). All offsets are 64-byte aligned so that copies run on whole cache lines.
//
//   rank r's region
//   +---------------------------------------------------------------------------------+
//   | dispatch area: one block per source rank s = 0 .. W-1                           |
//   |   block s: | head | token slot 0 | ... | token slot max-1 |                        |
//   |   head: i32 count (slots used), i32 flags, i32 expert counts [E_local] (rows     |
//   |     that s sends to each local expert), padded to 64 B                           |
//   |   token slot: | header | payload [H] in_dtype | scales [H / scale_block] f32 |    |
//   |   header: i32 token index at s, i32 n, then n triples (local expert e, top-k     |
//   |     slot j, position: how many earlier tokens of s chose e)                      |
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
//   | staging (ranks_per_node splits the world only): what goes to peers on other     |
//   |   nodes, which only puts reach (window to window, from this region):            |
//   |   dispatch, direct: one block image per destination rank d (head + token slots, |
//   |     as it lands in d's block for this rank); combine: one row per route; one     |
//   |     dtype word                                                                    |
//   | relay blocks (cross_node = hierarchical only), one per node n:                   |
//   |   relay out [n]: what this rank sends to node n's relay (the rank there with     |
//   |     its local index), built here and put whole;                                  |
//   |   relay in [n]: what node n's rank with this rank's local index sent to be        |
//   |     forwarded to this node's ranks                                               |
//   |   relay block: | head | relay slot 0 | ... | relay slot max-1 |                   |
//   |   head: i32 count (slots used), then per rank i of the node: i32 slots to i,     |
//   |     i32 expert counts [E_local] (as in i's own block head)                        |
//   |   relay slot: | header | payload | scales |; header: i32 token index, i32 n, i32   |
//   |     slot at each rank of the node [ranks_per_node] (-1: none), then n triples     |
//   |     (expert within the node, top-k slot j, position)                              |
//   | node sum (combine_sums_in_node only), per node n:                                |
//   |   weights out [n]: the router weights of this rank's tokens in node n's relay      |
//   |     block, f32 [max_tokens relay slots][max_node_pairs], pairs in header order     |
//   |   weights in [n]: the same, from node n's rank with this rank's local index        |
//   |   relay rows [n]: rows of this node's owners for that rank's tokens, at            |
//   |     (t * k + j) * combine_row, as in the combine area                              |
//   |   partial out [n] / partial in [n]: | i32 dtype (64 B) | one row per relay slot,   |
//   |     at partial_stride(row bytes) |: the node sums this rank puts to that rank, and |
//   |     those it gets from node n                                                      |
//   +---------------------------------------------------------------------------------+
//   signals (64 B each): slot s = dispatch data from s is complete; slot W + s = combine
//   rows from s (node sum: from a remote s, its node's partials); slot 2W + s
//   (hierarchical) = s's relay block for this rank is here; slot 3W + s (node sum) = s's
//   weights for its tokens in that block are here
//
// Source s writes block s of every destination rank: a token crosses to a rank once, with the
// list of that rank's experts it chose. Its counts and positions come with it, so a receiver
// finds every row's place from a W x E_local scan of the heads (expert e's rows from s start
// after the rows of e from sources before s), without reading the headers in order. Owner r
// writes rows (or row refs) into the source's combine area. In hierarchical mode a relay
// rebuilds source s's block at each rank of its node from s's relay block, byte for byte the
// block direct mode would have put there, so receivers cannot tell the modes apart.
#pragma once

#include <cstddef>
#include <cstdint>

#include "all_to_all/host_device.hpp"
#include "pmoe/all_to_all.hpp"

namespace pmoe::detail {

PMOE_HOST_DEVICE constexpr size_t align64(size_t bytes) { return (bytes + 63) / 64 * 64; }

struct AllToAllLayout {
  // The header of a token slot, in i32 words: the token's index at its source, the number n of
  // (local expert, top-k slot, position) triples that follow, then the triples.
  static constexpr int kHeaderToken = 0, kHeaderPairs = 1, kPairInts = 3;
  PMOE_HOST_DEVICE static constexpr int header_expert(int pair) { return 2 + kPairInts * pair; }
  PMOE_HOST_DEVICE static constexpr int header_slot(int pair) { return 3 + kPairInts * pair; }
  PMOE_HOST_DEVICE static constexpr int header_position(int pair) {
    return 4 + kPairInts * pair;
  }
  // The i32 words of a header with n pairs.
  PMOE_HOST_DEVICE static constexpr int header_ints(int pairs) { return 2 + kPairInts * pairs; }

  static constexpr size_t kDtypeSlot = 64;  // one owner's expert_y dtype in the combine area
  static constexpr int32_t kPayloadInPlace = 1;  // flags bit: payloads stay at the source
  // u64 words per signal slot: SymmetricMemory::kSignalBytes (checked where both are seen).
  static constexpr size_t kSignalWords = 8;

  AllToAllLayout() = default;
  AllToAllLayout(const AllToAllConfig& config, int world_size)
      : world_size(world_size),
        num_local_experts(config.num_experts / world_size),
        max_tokens(config.max_tokens),
        top_k(config.top_k),
        max_pairs(config.top_k < config.num_experts / world_size
                      ? config.top_k
                      : config.num_experts / world_size),
        block_head_bytes(align64(sizeof(int32_t) * (2 + size_t(num_local_experts)))),
        header_bytes(align64(sizeof(int32_t) * size_t(header_ints(max_pairs)))),
        payload_bytes(size_t(config.hidden_dim) * dtype_size(config.in_dtype)),
        scale_bytes(sizeof(float) * size_t(config.scales_per_token())),
        token_stride(header_bytes + align64(payload_bytes) + align64(scale_bytes)),
        source_block(block_head_bytes + size_t(max_tokens) * token_stride),
        combine_row(align64(size_t(config.hidden_dim) * sizeof(float))),
        combine_offset(size_t(world_size) * source_block),
        row_ref_offset(combine_offset + size_t(max_tokens) * top_k * combine_row),
        combine_dtype_offset(row_ref_offset +
                             align64(sizeof(int32_t) * size_t(max_tokens) * top_k)),
        input_offset(combine_dtype_offset + kDtypeSlot * size_t(world_size)),
        input_scale_offset(input_offset + (config.in_place_buffers
                                               ? align64(size_t(max_tokens) * payload_bytes)
                                               : 0)),
        expert_output_offset(input_scale_offset +
                             (config.in_place_buffers ? align64(size_t(max_tokens) * scale_bytes)
                                                      : 0)),
        expert_output_row(size_t(config.hidden_dim) * dtype_size(config.out_dtype)),
        total_bytes(expert_output_offset +
                    (config.in_place_buffers ? align64(size_t(config.num_experts) * max_tokens *
                                                       expert_output_row)
                                             : 0)) {
    const bool split = config.ranks_per_node > 0 && config.ranks_per_node < world_size;
    if (!split) return;
    hierarchical = config.cross_node == CrossNode::hierarchical;
    ranks_per_node = config.ranks_per_node;
    nodes = world_size / ranks_per_node;
    dispatch_stage_offset = align64(total_bytes);
    combine_stage_offset =
        dispatch_stage_offset + (hierarchical ? 0 : size_t(world_size) * source_block);
    stage_dtype_offset = combine_stage_offset + size_t(world_size) * max_tokens * max_pairs *
                                                    combine_row;
    total_bytes = stage_dtype_offset + kDtypeSlot;
    if (!hierarchical) return;
    const int node_experts = num_local_experts * ranks_per_node;
    max_node_pairs = top_k < node_experts ? top_k : node_experts;
    relay_head_bytes =
        align64(sizeof(int32_t) * (1 + size_t(ranks_per_node) * (1 + num_local_experts)));
    relay_header_bytes = align64(sizeof(int32_t) * size_t(relay_header_ints(max_node_pairs)));
    relay_token_stride = relay_header_bytes + align64(payload_bytes) + align64(scale_bytes);
    relay_block = relay_head_bytes + size_t(max_tokens) * relay_token_stride;
    relay_out_offset = align64(total_bytes);
    relay_in_offset = relay_out_offset + size_t(nodes) * relay_block;
    total_bytes = relay_in_offset + size_t(nodes) * relay_block;
    if (!config.combine_sums_in_node) return;
    node_sum = true;
    weights_block = align64(sizeof(float) * size_t(max_tokens) * max_node_pairs);
    relay_rows_block = size_t(max_tokens) * top_k * combine_row;
    partial_block = kDtypeSlot + size_t(max_tokens) * combine_row;
    weights_out_offset = align64(total_bytes);
    weights_in_offset = weights_out_offset + size_t(nodes) * weights_block;
    relay_rows_offset = weights_in_offset + size_t(nodes) * weights_block;
    partial_out_offset = relay_rows_offset + size_t(nodes) * relay_rows_block;
    partial_in_offset = partial_out_offset + size_t(nodes) * partial_block;
    total_bytes = partial_in_offset + size_t(nodes) * partial_block;
  }

  // Node sum (combine_sums_in_node only). The weights of relay slot `slot`, pair `pair`.
  PMOE_HOST_DEVICE size_t weights_out(int node, int slot, int pair) const {
    return weights_out_offset + size_t(node) * weights_block +
           sizeof(float) * (size_t(slot) * max_node_pairs + pair);
  }
  PMOE_HOST_DEVICE size_t weights_in(int node, int slot, int pair) const {
    return weights_in_offset + size_t(node) * weights_block +
           sizeof(float) * (size_t(slot) * max_node_pairs + pair);
  }
  // The bytes of `slots` relay slots' weights: what a source puts to a relay.
  PMOE_HOST_DEVICE size_t weights_bytes(int slots) const {
    return sizeof(float) * size_t(slots) * max_node_pairs;
  }
  // Row (token, top-k slot) of the source on `node` whose relay this rank is.
  PMOE_HOST_DEVICE size_t relay_row(int node, int token, int slot) const {
    return relay_rows_offset + size_t(node) * relay_rows_block +
           (size_t(token) * top_k + slot) * combine_row;
  }
  // A partial block: its dtype word at the start, then relay slot q's row at q * stride, where
  // stride is the row's bytes rounded up to 16 (whole 16-byte words for the reduction's loads).
  PMOE_HOST_DEVICE static constexpr size_t partial_stride(size_t row_bytes) {
    return (row_bytes + 15) / 16 * 16;
  }
  PMOE_HOST_DEVICE size_t partial_out(int node) const {
    return partial_out_offset + size_t(node) * partial_block;
  }
  PMOE_HOST_DEVICE size_t partial_in(int node) const {
    return partial_in_offset + size_t(node) * partial_block;
  }
  PMOE_HOST_DEVICE static constexpr size_t partial_row(size_t block, int slot, size_t row_bytes) {
    return block + kDtypeSlot + size_t(slot) * partial_stride(row_bytes);
  }
  // The bytes of a partial block with `slots` rows: what a relay puts to a source.
  PMOE_HOST_DEVICE static constexpr size_t partial_bytes(int slots, size_t row_bytes) {
    return kDtypeSlot + size_t(slots) * partial_stride(row_bytes);
  }

  // The rank on `node` with `rank`'s local index: a source's relay there, and a relay's source
  // from there (hierarchical only).
  PMOE_HOST_DEVICE int peer_on_node(int rank, int node) const {
    return node * ranks_per_node + rank % ranks_per_node;
  }
  // Relay blocks (hierarchical only). Header words of a relay slot: token, n, the slot at each
  // rank of the node, then n (expert within the node, top-k slot, position) triples.
  PMOE_HOST_DEVICE int relay_header_dest_slot(int local_rank) const { return 2 + local_rank; }
  PMOE_HOST_DEVICE int relay_header_expert(int pair) const {
    return 2 + ranks_per_node + kPairInts * pair;
  }
  PMOE_HOST_DEVICE int relay_header_slot(int pair) const { return relay_header_expert(pair) + 1; }
  PMOE_HOST_DEVICE int relay_header_position(int pair) const {
    return relay_header_expert(pair) + 2;
  }
  PMOE_HOST_DEVICE int relay_header_ints(int pairs) const {
    return 2 + ranks_per_node + kPairInts * pairs;
  }
  // Head words: the relay slots used, then per rank i of the node its count and expert counts.
  PMOE_HOST_DEVICE int relay_head_count(int local_rank) const {
    return 1 + local_rank * (1 + num_local_experts);
  }
  PMOE_HOST_DEVICE int relay_head_expert_count(int local_rank, int expert) const {
    return relay_head_count(local_rank) + 1 + expert;
  }
  PMOE_HOST_DEVICE size_t relay_out(int node) const {
    return relay_out_offset + size_t(node) * relay_block;
  }
  PMOE_HOST_DEVICE size_t relay_in(int node) const {
    return relay_in_offset + size_t(node) * relay_block;
  }
  // A relay slot within a relay block at `block` (relay_out or relay_in), and its payload.
  PMOE_HOST_DEVICE size_t relay_token_offset(size_t block, int slot) const {
    return block + relay_head_bytes + size_t(slot) * relay_token_stride;
  }
  PMOE_HOST_DEVICE size_t relay_payload_offset(size_t block, int slot) const {
    return relay_token_offset(block, slot) + relay_header_bytes;
  }
  PMOE_HOST_DEVICE size_t relay_scale_offset(size_t block, int slot) const {
    return relay_payload_offset(block, slot) + align64(payload_bytes);
  }

  // Staging (split worlds only): where this rank builds destination d's dispatch block, and the
  // combine row of route `route`.
  PMOE_HOST_DEVICE size_t dispatch_stage(int dest) const {
    return dispatch_stage_offset + size_t(dest) * source_block;
  }
  PMOE_HOST_DEVICE size_t combine_stage(int route) const {
    return combine_stage_offset + size_t(route) * combine_row;
  }

  // Dispatch area, block of `source`.
  PMOE_HOST_DEVICE size_t count_offset(int source) const { return size_t(source) * source_block; }
  PMOE_HOST_DEVICE size_t flags_offset(int source) const {
    return count_offset(source) + sizeof(int32_t);
  }
  // The rows `source` sends to local expert e this call.
  PMOE_HOST_DEVICE size_t expert_count_offset(int source, int expert) const {
    return count_offset(source) + sizeof(int32_t) * (2 + size_t(expert));
  }
  PMOE_HOST_DEVICE size_t token_offset(int source, int slot) const {
    return count_offset(source) + block_head_bytes + size_t(slot) * token_stride;
  }
  PMOE_HOST_DEVICE size_t payload_offset(int source, int slot) const {
    return token_offset(source, slot) + header_bytes;
  }
  PMOE_HOST_DEVICE size_t scale_offset(int source, int slot) const {
    return payload_offset(source, slot) + align64(payload_bytes);
  }
  // Combine area.
  PMOE_HOST_DEVICE size_t combine_row_offset(int token, int slot) const {
    return combine_offset + (size_t(token) * top_k + slot) * combine_row;
  }
  PMOE_HOST_DEVICE size_t row_ref_slot(int token, int slot) const {
    return row_ref_offset + (size_t(token) * top_k + slot) * sizeof(int32_t);
  }
  PMOE_HOST_DEVICE size_t combine_dtype_slot(int owner) const {
    return combine_dtype_offset + kDtypeSlot * size_t(owner);
  }
  // Signal slots, and the u64 word of a slot in a rank's signal array.
  PMOE_HOST_DEVICE int dispatch_signal(int source) const { return source; }
  PMOE_HOST_DEVICE int combine_signal(int source) const { return world_size + source; }
  PMOE_HOST_DEVICE int relay_signal(int source) const { return 2 * world_size + source; }
  PMOE_HOST_DEVICE int weights_signal(int source) const { return 3 * world_size + source; }
  PMOE_HOST_DEVICE int signal_slots() const {
    return (node_sum ? 4 : hierarchical ? 3 : 2) * world_size;
  }
  PMOE_HOST_DEVICE static constexpr size_t signal_word(int slot) {
    return size_t(slot) * kSignalWords;
  }

  int world_size = 0;
  int num_local_experts = 0;
  int max_tokens = 0;
  int top_k = 0;
  int max_pairs = 0;  // most experts of one rank that one token can choose
  size_t block_head_bytes = 0, header_bytes = 0, payload_bytes = 0, scale_bytes = 0, token_stride = 0,
         source_block = 0;
  size_t combine_row = 0, combine_offset = 0, row_ref_offset = 0, combine_dtype_offset = 0;
  size_t input_offset = 0, input_scale_offset = 0, expert_output_offset = 0,
         expert_output_row = 0;
  size_t total_bytes = 0;
  size_t dispatch_stage_offset = 0, combine_stage_offset = 0, stage_dtype_offset = 0;
  // A split world in hierarchical mode (else false and 0).
  bool hierarchical = false;
  int ranks_per_node = 0, nodes = 0, max_node_pairs = 0;
  size_t relay_head_bytes = 0, relay_header_bytes = 0, relay_token_stride = 0, relay_block = 0;
  size_t relay_out_offset = 0, relay_in_offset = 0;
  // Hierarchical with combine_sums_in_node (else false and 0).
  bool node_sum = false;
  size_t weights_block = 0, relay_rows_block = 0, partial_block = 0;
  size_t weights_out_offset = 0, weights_in_offset = 0, relay_rows_offset = 0,
         partial_out_offset = 0, partial_in_offset = 0;
};

}  // namespace pmoe::detail
