// What one AllToAll call moves, per rank and per link kind, for a given routing: the byte and
// transfer counts the scaling model (tools/pmoe-bench/model*) turns into time, and the reference
// a cross-node benchmark checks its own per-link counts against. Host code only.
//
// Assumptions (each one read off the code that moves the bytes):
// - Routing is route.hpp's rule, the one the ops use: slot j of a token's row sends it to expert
//   row[j] when first_in_group(row, j, E, 1) (no -1, no out-of-range, no repeat); the token goes
//   to rank d once, with one (expert, slot, position) triple per such j on d.
// - Dispatch, direct (src/cuda/all_to_all/dispatch.cu, send_tokens): one token slot per (token,
//   destination rank). To a rank on this node (load/store, or this rank itself) the kernel
//   stores the slot's header (4 * header_ints(n) bytes: token index, n, n triples), payload
//   (layout.payload_bytes) and scales (layout.scale_bytes): one transfer each slot; then one head
//   (count, flags, E_local expert counts: 4 * (2 + E_local) bytes, one transfer) and one signal.
//   To a rank on another node it builds the block image in its staging and puts it whole, window
//   to window, with the signal: ONE transfer of block_head_bytes + slots * token_stride bytes
//   (the 64-byte-padded head, and every slot at the layout's stride: the header padded for
//   max_pairs triples, payload and scales each padded to 64 B), one signal, even with 0 slots.
// - Combine, direct (combine.cu, return_rows): one row of H elements of expert_y's dtype
//   (count_traffic's expert_y_dtype; config.out_dtype unless given) per received
//   (token, local expert) pair back to the token's source, one transfer each (a put of exactly
//   those bytes off-node); then to every rank one dtype word (4 bytes, one transfer, a put with
//   the signal off-node) and one signal. Rows are not summed on the way: the source reduces them
//   in slot order (bit-exact).
// - Not counted: the copies into this rank's own staging before a put (local memory writes the
//   NIC reads again), and the receiver's landing of rows (RankTraffic::rows is its measure).
//   config.in_place_buffers is not modelled (the CUDA backend has none; on the CPU backend it
//   makes peers on the node read tokens and rows in place instead).
// - Dispatch, hierarchical (cross_node = hierarchical; dispatch.cu, send_tokens and
//   forward_relay_blocks): destinations on the source's node as in direct mode. For each other
//   node, the source builds one relay block for that node's relay (the rank there with the
//   source's local index) and puts it whole with a signal: ONE network transfer of
//   relay_head_bytes + slots * relay_token_stride (a slot per token that goes to any rank of
//   the node, its header holding the token's slot at every rank there and the triples of every
//   expert it chose there), even with 0 slots. The relay rebuilds the source's ordinary block at
//   each rank of its node, itself included (same_rank): one slot per (token, rank) with exact
//   header bytes as direct mode stores them, then the head and a signal.
// - Combine, hierarchical: the kernels return rows directly, as in direct mode (no relay can
//   save network bytes without summing, and summing changes the order of the sum).
// - Combine, hierarchical with relay_reduces (AllToAllConfig::combine_sums_in_node; combine.cu
//   and node_sum.cuh): owners on the source's node as in direct mode. An owner on a remote node
//   stores each row for the source (row_bytes, one transfer) at the source's relay on its node
//   (load/store, or same_rank when the owner is the relay), and its dtype word and signal go to
//   the ranks of its node only. Per (source, remote node): the source puts the weights of its
//   tokens in that node's relay block to the relay, ONE transfer of slots * max_node_pairs * 4
//   bytes with a signal (a lone signal, 0 bytes, with no slot); the relay puts back ONE
//   transfer of a 64-byte dtype head + slots * partial_stride(row_bytes) (the row padded to 16
//   bytes) with a signal. `rows`: the relay counts the remote rows it sums, the source its own
//   node's rows plus one partial per (token, remote node).
// - Link kinds: same_rank (source = destination), load_store (same node), network.
// - The critical-path rank of an op is the one with the most network bytes (the larger of sent
//   and received), then the most load/store bytes; the model computes its own per-rank times.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "pmoe/all_to_all.hpp"

namespace pmoe::detail {

enum class Link { same_rank = 0, load_store = 1, network = 2 };
inline constexpr int kLinkKinds = 3;
const char* link_name(Link link);

enum class TrafficMode { direct, hierarchical };
const char* mode_name(TrafficMode mode);

struct TrafficSetup {
  int world_size = 0;
  int ranks_per_node = 0;  // divides world_size
  TrafficMode mode = TrafficMode::direct;
  bool relay_reduces = false;  // hierarchical combine: the relay sums its node's rows
                               // (AllToAllConfig::combine_sums_in_node)
};

struct LinkCount {
  uint64_t bytes = 0;
  uint64_t transfers = 0;
  void add(uint64_t b) { bytes += b, ++transfers; }
  bool operator==(const LinkCount&) const = default;
};

struct RankTraffic {
  std::array<LinkCount, kLinkKinds> sent{};      // written by this rank (a relay's forwards too)
  std::array<LinkCount, kLinkKinds> received{};  // landed in this rank's memory
  std::array<uint64_t, kLinkKinds> signals_sent{};
  std::array<uint64_t, kLinkKinds> signals_received{};
  // (token, expert) rows this rank ends up with: dispatch, rows landed in its expert_x; combine,
  // rows its tokens get back to sum (the local copy and reduce work after the exchange).
  uint64_t rows = 0;
  bool operator==(const RankTraffic&) const = default;
};

struct OpTraffic {
  std::vector<RankTraffic> ranks;
  int critical_rank = 0;
  LinkCount total(Link link) const;  // summed over senders
  uint64_t signals(Link link) const;
};

struct Traffic {
  OpTraffic dispatch, combine;
};

// indices[r]: rank r's top-k rows, m_r * top_k int32 (m_r <= max_tokens, the
// same k for all). Throws pmoe::Error naming the argument on a bad setup or index.
// expert_y_dtype: the dtype of combine's expert_y (a call argument, not in the config), in which
// its rows travel: f32, bf16 or f16; config.out_dtype when not given.
Traffic count_traffic(const AllToAllConfig& config, const TrafficSetup& setup,
                      const std::vector<std::vector<int32_t>>& indices);
Traffic count_traffic(const AllToAllConfig& config, const TrafficSetup& setup,
                      const std::vector<std::vector<int32_t>>& indices, DType expert_y_dtype);

}  // namespace pmoe::detail
