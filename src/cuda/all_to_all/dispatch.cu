// AllToAll dispatch on the CUDA backend. Layout: src/all_to_all/layout.hpp (every offset below
// comes from it), scratch: params.cuh. Each kernel's critical path, and what it costs, is drawn in
// docs/gpu-all-to-all.md; the emulated device counts it (tests/cuda/test_cuda_critical_path.cpp).
//
//   send:  send_tokens  (grid)     one kernel; block b takes a run of consecutive tokens (one
//                                  each when there are fewer tokens than blocks) and routes them
//                                  itself: the tokens before its run counted in __shared__ (a
//                                  share per thread), its own earlier tokens walked by the thread
//                                  that holds each token. So a token's slot at each destination
//                                  and its position among each expert's rows follow token order,
//                                  and no block waits for another. Then each token is read once
//                                  and written to every destination, from rank + 1 on, with its
//                                  header; in place (x is this rank's input buffer) a direct
//                                  destination gets the header only and reads the token there. The last block to finish writes the heads (counts,
//                                  which every block added to), bumps the epoch and signals
//   recv:  route_rows   (1 block)  waits for every source; scans the W x E_local counts of the
//                                  heads into each (source, expert)'s first row (a thread per
//                                  expert) and each expert's first route (a block-wide scan);
//                                  (for Phase::both, the last block of send_tokens does this
//                                  instead, when every other block has ended: one kernel less)
//          land_rows    (grid)     each received slot: its rows (first row + position) get the
//                                  payload (read once, from the slot or in place from the
//                                  source's input buffer) and scales, and its routes are
//                                  written, ordered by (expert, row) for combine
// Only one block of a rank ever waits for a peer (route_rows), and none for a block of its own
// grid. Ranks sharing a GPU must not fill its SMs with waiting blocks: a peer's kernel that
// would let them go on could then never run.
#include "cuda/all_to_all/device_utils.cuh"
#include "cuda/transport/transport.cuh"
#include "cuda/all_to_all/kernels.hpp"
#include "cuda/check.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

// Experts whose counts send_tokens keeps in __shared__ at once (8 KiB); more take more passes.
constexpr int kExpertsPerPass = 2048;
// The first bad index slot travels as kBadSlotBase - slot, so that atomicMax finds it and 0 (the
// cleared word) means none.
constexpr int64_t kBadSlotBase = int64_t(1) << 30;
static_assert(kMaxRanks <= kBlockThreads, "route_rows gives each source one thread");

// Hierarchical dispatch(recv) at a relay, before its own waits: for each other node, the relay
// block that node's rank with this rank's local index sent here becomes that source's ordinary
// block at every rank of this node (this one included), byte for byte what direct mode would
// have put there, and each of them gets the signal the source would have sent. Nodes one at a
// time, each token by the whole block. A collective of the block; sets `failed` if a wait fails.
__device__ void forward_relay_blocks(const AllToAllParams& p, uint64_t epoch, bool& failed) {
  const AllToAllLayout& lay = p.layout;
  const int R = lay.ranks_per_node, L = p.num_local_experts, my_node = p.rank / R;
  const std::byte* region = p.regions[p.rank];
  auto peer = [&](int i) { return p.regions[my_node * R + i]; };  // node peers: load/store
  for (int n = 1; n < lay.nodes; ++n) {
    const int node = (my_node + n) % lay.nodes, source = lay.peer_on_node(p.rank, node);
    if (threadIdx.x == 0 && !wait_signal(p.transport, lay.relay_signal(source), epoch,
                                         p.timeout_ns, p.error, source, Step::dispatch_recv))
      failed = true;
    __syncthreads();
    if (failed) return;  // the same for every thread: written before the barrier
    const size_t block = lay.relay_in(node);
    const auto* head = reinterpret_cast<const int32_t*>(region + block);
    for (int q = 0; q < head[0]; ++q) {
      const auto* from =
          reinterpret_cast<const int32_t*>(region + lay.relay_token_offset(block, q));
      auto slot_at = [&](int i) { return from[lay.relay_header_dest_slot(i)]; };
      for (int i = threadIdx.x; i < R; i += blockDim.x) {  // headers: a thread per node rank
        if (slot_at(i) < 0) continue;
        auto* header = reinterpret_cast<int32_t*>(peer(i) + lay.token_offset(source, slot_at(i)));
        int pairs = 0;
        for (int x = 0; x < from[AllToAllLayout::kHeaderPairs]; ++x) {
          const int expert = from[lay.relay_header_expert(x)];
          if (expert / L != i) continue;
          store_to_peer(header + AllToAllLayout::header_expert(pairs), expert % L);
          store_to_peer(header + AllToAllLayout::header_slot(pairs),
                        from[lay.relay_header_slot(x)]);
          store_to_peer(header + AllToAllLayout::header_position(pairs),
                        from[lay.relay_header_position(x)]);
          ++pairs;
        }
        store_to_peer(header + AllToAllLayout::kHeaderToken, from[AllToAllLayout::kHeaderToken]);
        store_to_peer(header + AllToAllLayout::kHeaderPairs, pairs);
      }
      auto to = [&](int i) { return slot_at(i) >= 0; };
      copy_to_each(
          R, to, [&](int i) { return peer(i) + lay.payload_offset(source, slot_at(i)); },
          region + lay.relay_payload_offset(block, q), lay.payload_bytes);
      if (lay.scale_bytes)
        copy_to_each(
            R, to, [&](int i) { return peer(i) + lay.scale_offset(source, slot_at(i)); },
            region + lay.relay_scale_offset(block, q), lay.scale_bytes);
    }
    for (int i = threadIdx.x; i < R; i += blockDim.x) {  // heads: a thread per node rank
      std::byte* to = peer(i);
      store_to_peer(reinterpret_cast<int32_t*>(to + lay.count_offset(source)),
                    head[lay.relay_head_count(i)]);
      store_to_peer(reinterpret_cast<int32_t*>(to + lay.flags_offset(source)), 0);
      for (int e = 0; e < L; ++e)
        store_to_peer(reinterpret_cast<int32_t*>(to + lay.expert_count_offset(source, e)),
                      head[lay.relay_head_expert_count(i, e)]);
    }
    // Every thread's stores, before thread 0's signals: a release after the barrier publishes
    // them all (cumulative), so no fence is needed; the peers are on this node.
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int i = 0; i < R; ++i)
        signal_release(p.signals[my_node * R + i] + lay.signal_word(lay.dispatch_signal(source)),
                       epoch, p.transport.same_device);
    }
  }
}

// dispatch(recv)'s one waiting block (route_rows, or the last block of send_tokens): waits for
// every source, then each (source, expert)'s first row, each expert's first route and the end of
// each source's slots, for land_rows. A collective of the block.
__device__ void receive_heads(const AllToAllParams& p) {
  const uint64_t epoch = *p.epoch;
  const AllToAllLayout& lay = p.layout;
  const int W = p.world_size, L = p.num_local_experts;
  __shared__ bool failed;
  if (threadIdx.x == 0) {
    failed = failed_before(p) || !step_in_order(p, Step::dispatch_recv);
    p.round->next_step = int32_t(Step::combine_send);
  }
  __syncthreads();
  if (lay.hierarchical && !failed) forward_relay_blocks(p, epoch, failed);
  for (int i = threadIdx.x; i < W && !failed; i += blockDim.x) {
    const int source = (p.rank + i) % W;  // this rank's own data first: it is there already
    if (is_live(p, source) && !wait_signal(p.transport, lay.dispatch_signal(source), epoch,
                                           p.timeout_ns, p.error, source, Step::dispatch_recv))
      failed = true;
  }
  __syncthreads();
  if (failed) {
    for (int e = threadIdx.x; e < L; e += blockDim.x) p.expert_num_tokens[e] = 0;
    if (threadIdx.x == 0) {
      *p.route_count = 0;
      *p.slot_count = 0;
    }
    return;
  }
  allow_dependent_grid();  // land_rows may start launching: no block of this one waits any more
  const std::byte* region = p.regions[p.rank];
  auto head = [&](size_t offset) { return *reinterpret_cast<const int32_t*>(region + offset); };
  // Each thread a run of consecutive experts: each (source, expert)'s first row, the rows of
  // that expert from earlier sources (W steps an expert), and the expert's count.
  const int per_thread = (L + int(blockDim.x) - 1) / int(blockDim.x);
  const int e_first = min(L, int(threadIdx.x) * per_thread), e_last = min(L, e_first + per_thread);
  int my_rows = 0;
  for (int e = e_first; e < e_last; ++e) {
    count_serial_steps(W + 1);
    int rows = 0;
    for (int s = 0; s < W; ++s) {
      p.recv_base[s * L + e] = rows;
      if (is_live(p, s)) rows += head(lay.expert_count_offset(s, e));  // a masked one's is stale
    }
    p.expert_num_tokens[e] = rows;
    my_rows += rows;
  }
  // Each expert's first route: the rows of the experts before it, a block-wide scan.
  int routes = 0, route = block_exclusive_sum(my_rows, routes);
  for (int e = e_first; e < e_last; ++e) {
    count_serial_steps(1);
    p.route_base[e] = route;
    route += p.expert_num_tokens[e];
  }
  // The end of each source's slots in one list of every source's, in (source, slot) order: a
  // thread per source.
  for (int s = threadIdx.x; s < W; s += blockDim.x) {
    count_serial_steps(s + 1);
    int end = 0;
    for (int q = 0; q <= s; ++q)
      if (is_live(p, q)) end += head(lay.count_offset(q));
    p.source_end[s] = end;
    if (s == W - 1) *p.slot_count = end;
  }
  if (threadIdx.x == 0) *p.route_count = routes;
}

// send_tokens' copies of one block's tokens [first, last), routed by route_block: each token's
// headers, then its payload (and scales), read once and written to every destination. A
// collective of the block.
__device__ void send_block_tokens(const AllToAllParams& p, int first, int last) {
  const AllToAllLayout& lay = p.layout;
  const int k = p.top_k, W = p.world_size, L = p.num_local_experts, E = L * W;
  const size_t payload = lay.payload_bytes, scales = lay.scale_bytes;
  // Where this rank's block at `dest` is written: in place at a direct peer, or in this rank's
  // staging image of it at a remote one (the last block puts it whole: puts go window to window).
  // `offset` is a region offset of this rank's block (count_offset(p.rank) onwards).
  auto in_block = [&](int dest, size_t offset) {
    return p.regions[dest] ? p.regions[dest] + offset
                           : p.regions[p.rank] + lay.dispatch_stage(dest) +
                                 (offset - lay.count_offset(p.rank));
  };
  // Hierarchical: ranks on other nodes are reached through their node's relay (the rank there
  // with this rank's local index): one relay slot per (token, node), built in relay_out(node).
  const bool relay = lay.hierarchical;
  const int R = relay ? lay.ranks_per_node : W, N = lay.nodes, my_node = p.rank / R;
  auto via_relay = [&](int dest) { return relay && dest / R != my_node; };
  for (int t = first; t < last; ++t) {
    // Headers: one thread per destination.
    const int32_t* row = p.indices + t * k;
    for (int dest = threadIdx.x; dest < W; dest += blockDim.x) {
      const int slot = p.send_slot[t * W + dest];
      if (slot < 0 || via_relay(dest)) continue;
      auto* header = reinterpret_cast<int32_t*>(in_block(dest, lay.token_offset(p.rank, slot)));
      int n = 0;
      for (int j = 0; j < k; ++j) {
        if (!first_in_group(row, j, E, 1) || row[j] / L != dest) continue;
        store_to_peer(header + AllToAllLayout::header_expert(n), row[j] % L);
        store_to_peer(header + AllToAllLayout::header_slot(n), j);
        store_to_peer(header + AllToAllLayout::header_position(n), p.send_position[t * k + j]);
        ++n;
      }
      store_to_peer(header + AllToAllLayout::kHeaderToken, t);
      store_to_peer(header + AllToAllLayout::kHeaderPairs, n);
    }
    // Relay headers: one thread per other node; the token's slot at each rank of the node, and
    // the triples of every expert it chose there (in slot order, as the ranks' own headers).
    for (int node = threadIdx.x; relay && node < N; node += blockDim.x) {
      const int slot = node == my_node ? -1 : p.relay_slot[t * N + node];
      if (slot < 0) continue;
      auto* header = reinterpret_cast<int32_t*>(
          p.regions[p.rank] + lay.relay_token_offset(lay.relay_out(node), slot));
      for (int i = 0; i < R; ++i)
        store_to_peer(header + lay.relay_header_dest_slot(i), p.send_slot[t * W + node * R + i]);
      int n = 0;
      for (int j = 0; j < k; ++j) {
        if (!first_in_group(row, j, E, 1) || row[j] / (R * L) != node) continue;
        store_to_peer(header + lay.relay_header_expert(n), row[j] - node * R * L);
        store_to_peer(header + lay.relay_header_slot(n), j);
        store_to_peer(header + lay.relay_header_position(n), p.send_position[t * k + j]);
        ++n;
      }
      store_to_peer(header + AllToAllLayout::kHeaderToken, t);
      store_to_peer(header + AllToAllLayout::kHeaderPairs, n);
    }
    // Where the token goes: targets i < W are destination ranks, from rank + 1 on, so that ranks
    // do not all write to rank 0 first; targets W + n are the relay blocks of other nodes. The
    // payload is read once for all of them.
    auto dest_of = [&](int i) { return (p.rank + 1 + i) % W; };
    auto slot_at = [&](int i) {
      if (i < W) return via_relay(dest_of(i)) ? -1 : p.send_slot[t * W + dest_of(i)];
      return i - W == my_node ? -1 : p.relay_slot[t * N + (i - W)];
    };
    auto target = [&](int i, bool scale) {
      if (i < W) {
        const int slot = slot_at(i);
        return in_block(dest_of(i), scale ? lay.scale_offset(p.rank, slot)
                                          : lay.payload_offset(p.rank, slot));
      }
      const size_t block = lay.relay_out(i - W);
      return p.regions[p.rank] + (scale ? lay.relay_scale_offset(block, slot_at(i))
                                        : lay.relay_payload_offset(block, slot_at(i)));
    };
    // In place (x is this rank's input buffer): a direct destination reads the token from
    // there itself, and gets the header only.
    auto copied_to = [&](int i) {
      return slot_at(i) >= 0 && !(i < W && p.x_in_place && p.regions[dest_of(i)]);
    };
    const int targets = W + (relay ? N : 0);
    copy_to_each(
        targets, copied_to, [&](int i) { return target(i, false); }, p.x + size_t(t) * payload,
        payload);
    if (scales)
      copy_to_each(
          targets, copied_to, [&](int i) { return target(i, true); },
          reinterpret_cast<const std::byte*>(p.x_scale) + size_t(t) * scales, scales);
  }
}

// send_tokens' routing of one block's tokens, [first, last): each token's slot at every
// destination rank (and relay node) and each (token, j)'s position among its expert's rows:
// the tokens before the block, counted into __shared__ tables with a share of them per thread,
// then the block's own tokens in order, each bumping the tables. Both follow token order, so
// the layout is the same whatever the grid. Adds the block's rows to the totals the heads carry
// and records the first bad index. A collective of the block; the block's barrier rounds are
// 2 + (last - first) + 1 a pass (one pass below 2048 experts).
__device__ void route_block(const AllToAllParams& p, int first, int last) {
  const int k = p.top_k, W = p.world_size, L = p.num_local_experts, E = L * W;
  const bool relay = p.layout.hierarchical;
  const int N = p.layout.nodes, node_experts = L * p.layout.ranks_per_node;
  __shared__ int dest_before[kMaxRanks], node_before[kMaxRanks];
  __shared__ int expert_before[kExpertsPerPass];
  const int32_t* indices = p.indices;
  auto row_of = [&](int t) { return indices + size_t(t) * k; };
  const int me = threadIdx.x;
  // The checks of the block's tokens, a token per thread.
  for (int t = first + me; t < last; t += blockDim.x) {
    const int32_t* row = row_of(t);
    for (int j = 0; j < k; ++j)
      if (row[j] != -1 && !first_in_group(row, j, E, 1)) {
        // Largest for the first bad slot in row-major order, the one reported; 0 means none.
        atomicMax(p.send_first_bad, int(kBadSlotBase - (int64_t(t) * k + j)));
        break;
      }
  }
  // No slot at any destination (or relay) until one is given below; the pass's first barrier
  // orders these before.
  for (int i = me; i < (last - first) * W; i += blockDim.x) p.send_slot[first * W + i] = -1;
  for (int i = me; relay && i < (last - first) * N; i += blockDim.x)
    p.relay_slot[first * N + i] = -1;
  for (int pass = 0; pass < E; pass += kExpertsPerPass) {
    const int keys = min(kExpertsPerPass, E - pass);
    const bool first_pass = pass == 0;
    for (int i = me; i < keys; i += blockDim.x) expert_before[i] = 0;
    for (int i = me; first_pass && i < W; i += blockDim.x) dest_before[i] = 0;
    for (int i = me; first_pass && relay && i < N; i += blockDim.x) node_before[i] = 0;
    __syncthreads();
    // The tokens before this block's, a share per thread.
    for (int t = me; t < first; t += blockDim.x) {
      count_serial_steps(k);  // the token's k entries
      const int32_t* row = row_of(t);
      for (int j = 0; j < k; ++j) {
        const int e = row[j];
        if (!first_in_group(row, j, E, 1)) continue;
        if (e >= pass && e < pass + keys) atomicAdd(&expert_before[e - pass], 1);
        if (!first_pass) continue;
        if (first_in_group(row, j, E, L)) atomicAdd(&dest_before[e / L], 1);
        if (relay && first_in_group(row, j, E, node_experts))
          atomicAdd(&node_before[e / node_experts], 1);
      }
    }
    __syncthreads();
    // This block's tokens in order, a thread per top-k slot: a slot's place is the table's
    // count, which it then bumps. The slots of one token that count go to distinct experts (and
    // distinct ranks, nodes), so they touch distinct entries; a barrier between tokens.
    for (int t = first; t < last; ++t) {
      const int32_t* row = row_of(t);
      for (int j = me; j < k; j += blockDim.x) {
        count_serial_steps(k);
        const int e = row[j];
        if (!first_in_group(row, j, E, 1)) continue;
        if (e >= pass && e < pass + keys) {
          p.send_position[t * k + j] = expert_before[e - pass]++;
          atomicAdd(&p.send_expert_count[e], 1);
        }
        if (!first_pass) continue;
        if (first_in_group(row, j, E, L)) {
          p.send_slot[t * W + e / L] = dest_before[e / L]++;
          atomicAdd(&p.send_count[e / L], 1);
        }
        // Hierarchical: its slot in each other node's relay block (this rank's node counts
        // too, unused).
        if (relay && first_in_group(row, j, E, node_experts)) {
          p.relay_slot[t * N + e / node_experts] = node_before[e / node_experts]++;
          atomicAdd(&p.relay_tally[e / node_experts], 1);
        }
      }
      __syncthreads();
    }
  }
}

// send_tokens' last block, once every block has routed and copied its tokens: the reports, the
// heads (counts) at every destination and every relay, the epoch and the signals; then the
// totals are cleared for the next call. A collective of the block.
__device__ void finish_send(const AllToAllParams& p, bool& sent) {
  const AllToAllLayout& lay = p.layout;
  const int W = p.world_size, L = p.num_local_experts, E = L * W;
  const int tokens = tokens_this_call(p), requested = requested_tokens(p);
  const bool relay = lay.hierarchical;
  const int R = relay ? lay.ranks_per_node : W, N = lay.nodes, my_node = p.rank / R;
  auto via_relay = [&](int dest) { return relay && dest / R != my_node; };
  __shared__ bool go;
  if (threadIdx.x == 0) {
    // A block that found the step out of order (or an earlier error) sent nothing; neither does
    // this one. step_in_order reports it (the first report wins, so once is enough).
    go = p.block_counters[kSendAborted] == 0;
    if (!go && !failed_before(p)) step_in_order(p, Step::dispatch_send);
    if (go && requested != tokens)
      report(p.error, kTooManyTokens, requested, Step::dispatch_send, p.m);
    // The relay counts, kept past this call: combine's node sum reads them.
    for (int node = 0; go && relay && node < N; ++node) p.relay_count[node] = p.relay_tally[node];
    const int bad = *p.send_first_bad;
    if (go && bad > 0) {
      const int position = int(kBadSlotBase - bad);
      report(p.error, kBadIndex, position, Step::dispatch_send, p.indices[position]);
    }
  }
  __syncthreads();
  sent = go;
  if (go) {
    // Heads: every thread a share of each destination's expert counts.
    for (int i = 0; i < W; ++i) {
      const int dest = (p.rank + 1 + i) % W;
      if (via_relay(dest) || !is_live(p, dest)) continue;  // relayed, or masked: nothing to it
      // As if it were dest's region: a remote peer's block is built in this rank's staging.
      std::byte* region = p.regions[dest] ? p.regions[dest]
                                          : p.regions[p.rank] + lay.dispatch_stage(dest) -
                                                lay.count_offset(p.rank);
      for (int e = threadIdx.x; e < L; e += blockDim.x) {
        count_serial_steps(1);
        store_to_peer(reinterpret_cast<int32_t*>(region + lay.expert_count_offset(p.rank, e)),
                      p.send_expert_count[dest * L + e]);
      }
      if (threadIdx.x == 0) {
        store_to_peer(reinterpret_cast<int32_t*>(region + lay.count_offset(p.rank)),
                      p.send_count[dest]);
        // In place, a direct destination reads the payloads from this rank's input buffer.
        store_to_peer(reinterpret_cast<int32_t*>(region + lay.flags_offset(p.rank)),
                      p.x_in_place && p.regions[dest] ? AllToAllLayout::kPayloadInPlace : 0);
      }
    }
    for (int node = 0; relay && node < N; ++node) {  // relay heads: each rank's count and counts
      if (node == my_node) continue;
      auto* head = reinterpret_cast<int32_t*>(p.regions[p.rank] + lay.relay_out(node));
      if (threadIdx.x == 0) store_to_peer(head, p.relay_count[node]);
      for (int q = threadIdx.x; q < R * (L + 1); q += blockDim.x) {
        count_serial_steps(1);
        const int r = q / (L + 1), e = q % (L + 1) - 1, dest = node * R + r;
        if (e < 0)
          store_to_peer(head + lay.relay_head_count(r), p.send_count[dest]);
        else
          store_to_peer(head + lay.relay_head_expert_count(r, e),
                        p.send_expert_count[dest * L + e]);
      }
    }
  }
  // Every thread's heads, before thread 0's fence and signals.
  __syncthreads();
  if (threadIdx.x == 0 && go) {
    const uint64_t epoch = ++*p.epoch;
    // After the barrier: cumulative over the block's stores.
    fence_for_peers(p.transport.same_device);
    for (int i = 0; i < W; ++i) {
      const int dest = (p.rank + 1 + i) % W;
      if (!is_live(p, dest)) continue;
      if (p.signals[dest]) {
        signal_release(p.signals[dest] + lay.signal_word(lay.dispatch_signal(p.rank)), epoch,
                       p.transport.same_device);
      } else if (via_relay(dest)) {
        continue;  // the relay signals it
      } else if (!put_signal(p.transport, dest, lay.count_offset(p.rank), lay.dispatch_stage(dest),
                             lay.block_head_bytes + size_t(p.send_count[dest]) * lay.token_stride,
                             lay.dispatch_signal(p.rank))) {
        report(p.error, kNoRemote, dest, Step::dispatch_send);
      }
    }
    for (int n = 1; relay && n < N; ++n) {  // each other node's relay block, whole, to its relay
      const int node = (my_node + n) % N, relay_rank = lay.peer_on_node(p.rank, node);
      if (!put_signal(p.transport, relay_rank, lay.relay_in(my_node), lay.relay_out(node),
                      lay.relay_head_bytes + size_t(p.relay_count[node]) * lay.relay_token_stride,
                      lay.relay_signal(p.rank)))
        report(p.error, kNoRemote, relay_rank, Step::dispatch_send);
    }
    // The staging is rewritten by the next dispatch: every put must have left it by then. This
    // thread issued every put of the kernel, and a flush covers the calling thread's only.
    flush(p.transport);
    p.round->dispatched_m = tokens;
    p.round->next_step = int32_t(Step::dispatch_recv);
  }
  // The totals start from zero at the next call (every block adds to them); thread 0's puts
  // above read them for their sizes.
  __syncthreads();
  for (int i = threadIdx.x; i < E; i += blockDim.x) {
    count_serial_steps(1);
    p.send_expert_count[i] = 0;
  }
  for (int i = threadIdx.x; i < W; i += blockDim.x) p.send_count[i] = 0;
  for (int i = threadIdx.x; relay && i < N; i += blockDim.x) p.relay_tally[i] = 0;
  if (threadIdx.x == 0) {
    *p.send_first_bad = 0;
    p.block_counters[kSendAborted] = 0;
  }
}

__global__ void __launch_bounds__(kBlockThreads) send_tokens(const AllToAllParams p) {
  const int tokens = tokens_this_call(p);
  // Each block takes a run of consecutive tokens; with fewer tokens than blocks, one each.
  const int per_block = (tokens + int(gridDim.x) - 1) / int(gridDim.x);
  const int first = min(tokens, int(blockIdx.x) * per_block), last = min(tokens, first + per_block);
  __shared__ bool go;
  if (threadIdx.x == 0) {
    // The step and earlier errors, read by each block. The last block writes next_step only
    // after every block has counted in, so all read the same step; an error reported meanwhile
    // may stop some blocks and not others, and then the last block sends nothing at all.
    go = !failed_before(p) && p.round->next_step == int32_t(Step::dispatch_send);
    if (!go) atomicExch(reinterpret_cast<int*>(&p.block_counters[kSendAborted]), 1);
  }
  __syncthreads();
  if (go && first < last) {
    route_block(p, first, last);
    send_block_tokens(p, first, last);
  }
  if (!last_block_all(&p.block_counters[kSendDone], p.transport.same_device)) return;
  bool sent = false;
  finish_send(p, sent);
  if (p.fuse_recv && sent) {
    __syncthreads();  // the epoch, bumped above
    receive_heads(p);
  }
}

__global__ void __launch_bounds__(kBlockThreads) route_rows(const AllToAllParams p) {
  receive_heads(p);
}

__global__ void __launch_bounds__(kBlockThreads) land_rows(const AllToAllParams p) {
  wait_for_prior_grid();
  if (failed_before(p)) return;  // a step out of order left last call's slots in place
  const int slots = *p.slot_count;
  const AllToAllLayout& lay = p.layout;
  const int L = p.num_local_experts;
  const size_t payload = lay.payload_bytes, scales = lay.scale_bytes;
  const std::byte* region = p.regions[p.rank];
  // Slots come in source order and a block's slots only rise, so the search for each slot's
  // source goes on from the last one: W steps a block, not a slot.
  int source = 0;
  for (int i = blockIdx.x; i < slots; i += gridDim.x) {
    while (p.source_end[source] <= i) {
      count_serial_steps(1);
      ++source;
    }
    const int slot = i - (source > 0 ? p.source_end[source - 1] : 0);
    const auto* header = reinterpret_cast<const int32_t*>(region + lay.token_offset(source, slot));
    const int pairs = header[AllToAllLayout::kHeaderPairs];
    // The payload (and scales): in the slot, or where the source keeps it, in its input buffer.
    const bool in_place =
        *reinterpret_cast<const int32_t*>(region + lay.flags_offset(source)) &
        AllToAllLayout::kPayloadInPlace;
    const int token = header[AllToAllLayout::kHeaderToken];
    const std::byte* payload_at =
        in_place ? p.regions[source] + lay.input_offset + size_t(token) * payload
                 : region + lay.payload_offset(source, slot);
    const std::byte* scales_at =
        in_place ? p.regions[source] + lay.input_scale_offset + size_t(token) * scales
                 : region + lay.scale_offset(source, slot);
    auto row_of = [&](int q) {
      const int e = header[AllToAllLayout::header_expert(q)];
      return e * p.rows_per_expert + p.recv_base[source * L + e] +
             header[AllToAllLayout::header_position(q)];
    };
    auto all = [](int) { return true; };
    copy_to_each(
        pairs, all, [&](int q) { return p.expert_x + size_t(row_of(q)) * payload; }, payload_at,
        payload);
    if (scales)
      copy_to_each(
          pairs, all,
          [&](int q) {
            return reinterpret_cast<std::byte*>(p.expert_x_scale) + size_t(row_of(q)) * scales;
          },
          scales_at, scales);
    // Routes in (expert, row) order, so combine sends each expert's rows together.
    for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
      const int e = header[AllToAllLayout::header_expert(q)];
      const int within = p.recv_base[source * L + e] + header[AllToAllLayout::header_position(q)];
      p.routes[p.route_base[e] + within] =
          Route{source, header[AllToAllLayout::kHeaderToken], header[AllToAllLayout::header_slot(q)],
                int32_t(e * p.rows_per_expert + within), slot};
    }
  }
}

}  // namespace

void launch_dispatch_send(const AllToAllParams& p, cudaStream_t stream, int blocks) {
  // A block per token at most: blocks without tokens would only count in at the last block. m
  // bounds the tokens of the call, also when bound_m gives them (graph replays).
  launch("send_tokens", send_tokens, std::max(1, std::min(blocks, p.m)), stream, p);
}

void launch_dispatch_recv(const AllToAllParams& p, cudaStream_t stream, int blocks, bool waited) {
  if (!waited) launch("route_rows", route_rows, 1, stream, p);
  launch_dependent("land_rows", land_rows, blocks, stream, p);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
