// AllToAll dispatch on the CUDA backend. Layout: src/all_to_all/layout.hpp (every offset below
// comes from it), scratch: params.cuh.
//
//   send:  send_tokens  (grid)     one kernel. The block that takes ticket 0 routes: index
//                                  checks; token t's slot at each destination rank and its
//                                  position among the tokens of each expert it chose (prefix
//                                  sums over tokens, so both follow token order); per (rank,
//                                  expert) counts. The other blocks wait for it (a block of
//                                  their own grid that already runs, so the wait is short and
//                                  safe), then each token is read once and written to every
//                                  destination, starting at rank + 1, with its header; the last
//                                  block bumps the epoch, writes the heads (counts) and signals
//   recv:  route_rows   (1 block)  waits for every source; scans the W x E_local counts of the
//                                  heads into each (source, expert)'s first row; counts (for
//                                  Phase::both, the last block of send_tokens does this instead,
//                                  when every other block has ended: one kernel less)
//          land_rows    (grid)     each received slot: its rows (first row + position) get the
//                                  payload (read once) and scales, and its routes are written,
//                                  ordered by (expert, row) for combine
// Only one block of a rank ever waits for a peer (route_rows). Ranks sharing a GPU must not fill
// its SMs with waiting blocks: a peer's kernel that would let them go on could then never run.
#include "cuda/all_to_all/device_utils.cuh"
#include "cuda/transport/transport.cuh"
#include "cuda/all_to_all/kernels.hpp"
#include "cuda/check.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

constexpr int kKeysPerPass = 32;  // keys rank_by_key counts at once: a 32 KiB table in __shared__
static_assert(kMaxRanks <= kBlockThreads, "route_rows gives each source one thread");

// rows[g][t] (g < n, t a thread of the block) becomes rows[g][0] + ... + rows[g][t].
template <int N>
__device__ void inclusive_scan_rows(int (&rows)[N][kBlockThreads], int n) {
  const int me = threadIdx.x;
  for (int step = 1; step < kBlockThreads; step *= 2) {
    __syncthreads();
    int add[N];
    for (int g = 0; g < n; ++g) add[g] = me >= step ? rows[g][me - step] : 0;
    __syncthreads();
    for (int g = 0; g < n; ++g) rows[g][me] += add[g];
  }
  __syncthreads();
}

// Stable ranking by key with the whole block (kBlockThreads threads, each a run of consecutive
// items). visit(item, f) calls f(key, j) for each distinct key of the item, key in
// [0, num_keys); then emit(item, key, j, rank, place) where rank counts the earlier items with
// that key and place the pairs before it in (key, item) order, and total(key, pairs) once per
// key. Returns the number of pairs. Each pass over the items counts kKeysPerPass keys per thread,
// and a prefix sum over the threads turns the counts into ranks.
// `counts` is the caller's __shared__ table (one for all the calls of a kernel: each call's own
// would add up past the limit on __shared__).
using KeyCounts = int[kKeysPerPass][kBlockThreads];
template <typename Visit, typename Emit, typename Total>
__device__ int rank_by_key(KeyCounts& counts, int items, int num_keys, Visit visit, Emit emit,
                           Total total) {
  const int me = threadIdx.x, per_thread = (items + kBlockThreads - 1) / kBlockThreads;
  const int begin = min(items, me * per_thread), end = min(items, begin + per_thread);
  int pairs = 0;
  for (int first = 0; first < num_keys; first += kKeysPerPass) {
    const int keys = min(kKeysPerPass, num_keys - first);
    for (int g = 0; g < keys; ++g) counts[g][me] = 0;
    for (int i = begin; i < end; ++i)
      visit(i, [&](int key, int) {
        if (key >= first && key < first + keys) ++counts[key - first][me];
      });
    inclusive_scan_rows(counts, keys);
    int rank[kKeysPerPass], place[kKeysPerPass];
    for (int g = 0; g < keys; ++g) {
      rank[g] = me > 0 ? counts[g][me - 1] : 0;
      place[g] = pairs + rank[g];
      pairs += counts[g][kBlockThreads - 1];
    }
    for (int i = begin; i < end; ++i)
      visit(i, [&](int key, int j) {
        const int g = key - first;
        if (g >= 0 && g < keys) emit(i, key, j, rank[g]++, place[g]++);
      });
    if (me < keys) total(first + me, counts[me][kBlockThreads - 1]);
    __syncthreads();  // the next pass clears the table
  }
  return pairs;
}

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
    // Every thread's stores, before thread 0's signals: a release of system scope after the
    // barrier publishes them all (cumulative), so no fence is needed; the peers are on this node.
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int i = 0; i < R; ++i)
        signal_release(p.signals[my_node * R + i] + lay.signal_word(lay.dispatch_signal(source)),
                       epoch);
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
    if (!wait_signal(p.transport, lay.dispatch_signal(source), epoch, p.timeout_ns, p.error,
                     source, Step::dispatch_recv))
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
  // Each (source, expert)'s first row: the rows of that expert from earlier sources (a thread
  // per expert, W steps); then each expert's first route (one thread, E_local steps).
  for (int e = threadIdx.x; e < L; e += blockDim.x) {
    int rows = 0;
    for (int s = 0; s < W; ++s) {
      p.recv_base[s * L + e] = rows;
      rows += head(lay.expert_count_offset(s, e));
    }
    p.expert_num_tokens[e] = rows;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int routes = 0;
    for (int e = 0; e < L; ++e) {
      p.route_base[e] = routes;
      routes += p.expert_num_tokens[e];
    }
    *p.route_count = routes;
    int slots = 0;  // every source's slots in one list, in (source, slot) order
    for (int s = 0; s < W; ++s) {
      slots += head(lay.count_offset(s));
      p.source_end[s] = slots;
    }
    *p.slot_count = slots;
  }
}

// Ticket 0's work in send_tokens: checks, slots, positions and counts into scratch. False if the
// step is out of order (a fatal error is then recorded and nothing is sent).
__device__ bool route_tokens(const AllToAllParams& p) {
  const int requested = requested_tokens(p), tokens = tokens_this_call(p);
  const int k = p.top_k, W = p.world_size, L = p.num_local_experts, E = L * W;
  __shared__ bool in_order;
  __shared__ int first_bad;  // the first bad slot in row-major order: the one reported
  if (threadIdx.x == 0) {
    in_order = !failed_before(p) && step_in_order(p, Step::dispatch_send);
    first_bad = tokens * k;
  }
  __syncthreads();
  if (!in_order) return false;
  if (requested != tokens && threadIdx.x == 0)
    report(p.error, kTooManyTokens, requested, Step::dispatch_send, p.m);
  // Indices the host could not check (they live on the device): out of range or repeated in a
  // row. They are reported, and the slot is treated as -1 so that peers still complete.
  for (int i = threadIdx.x; i < tokens * k; i += blockDim.x) {
    const int e = p.indices[i];
    if (e != -1 && !first_in_group(p.indices + i / k * k, i % k, E, 1)) {
      atomicMin(&first_bad, i);
      break;  // this thread's later slots come after it
    }
  }
  for (int i = threadIdx.x; i < tokens * W; i += blockDim.x) store_to_peer(p.send_slot + i, -1);
  const int N = p.layout.nodes;
  if (p.layout.hierarchical)
    for (int i = threadIdx.x; i < tokens * N; i += blockDim.x) store_to_peer(p.relay_slot + i, -1);
  // Other threads overwrite the slots of the destinations a token goes to; first_bad is final.
  __syncthreads();
  if (threadIdx.x == 0 && first_bad < tokens * k)
    report(p.error, kBadIndex, first_bad, Step::dispatch_send, p.indices[first_bad]);
  // A token's slot at a destination: the tokens before it that go there, in token order.
  __shared__ KeyCounts counts;
  rank_by_key(
      counts, tokens, W,
      [&](int t, auto f) {
        const int32_t* row = p.indices + t * k;
        for (int j = 0; j < k; ++j)
          if (first_in_group(row, j, E, L)) f(row[j] / L, j);
      },
      [&](int t, int dest, int, int slot, int) { store_to_peer(p.send_slot + t * W + dest, slot); },
      [&](int dest, int count) { store_to_peer(p.send_count + dest, count); });
  // A row's position within its expert's rows from this rank: the tokens before it that chose
  // that expert. Sent in the header, with the per-expert counts in the head, so receivers need
  // no walk over the headers.
  rank_by_key(
      counts, tokens, E,
      [&](int t, auto f) {
        const int32_t* row = p.indices + t * k;
        for (int j = 0; j < k; ++j)
          if (first_in_group(row, j, E, 1)) f(row[j], j);
      },
      [&](int t, int, int j, int position, int) {
        store_to_peer(p.send_position + t * k + j, position);
      },
      [&](int expert, int count) { store_to_peer(p.send_expert_count + expert, count); });
  // Hierarchical: a token's slot in each node's relay block, the tokens before it that go to a
  // rank of that node (this rank's own node counts too, unused).
  if (p.layout.hierarchical) {
    const int node_experts = L * p.layout.ranks_per_node;
    rank_by_key(
        counts, tokens, N,
        [&](int t, auto f) {
          const int32_t* row = p.indices + t * k;
          for (int j = 0; j < k; ++j)
            if (first_in_group(row, j, E, node_experts)) f(row[j] / node_experts, j);
        },
        [&](int t, int node, int, int slot, int) {
          store_to_peer(p.relay_slot + t * N + node, slot);
        },
        [&](int node, int count) { store_to_peer(p.relay_count + node, count); });
  }
  if (threadIdx.x == 0) {
    p.round->dispatched_m = tokens;
    p.round->next_step = int32_t(Step::dispatch_recv);
  }
  return true;
}

__global__ void __launch_bounds__(kBlockThreads) send_tokens(const AllToAllParams p) {
  // Tickets in the order blocks start: ticket 0 is running when others wait for it.
  __shared__ uint32_t ticket;
  __shared__ bool go;
  if (threadIdx.x == 0) {
    ticket = atomicAdd(&p.block_counters[kSendTicket], 1u);
    if (ticket == gridDim.x - 1) p.block_counters[kSendTicket] = 0;  // the last taker
  }
  __syncthreads();
  const uint64_t call = *p.epoch + 1;  // the last block bumps the epoch after all have read it
  if (ticket == 0) {
    // route_tokens reads failed_before once, in thread 0, for the whole block: a check here, made
    // by each thread, could differ between threads (a peer may report meanwhile) and send some
    // past route_tokens' barriers, which the garbage in __shared__ `go` then shows.
    const bool routed = route_tokens(p);
    if (threadIdx.x == 0) {
      store_to_peer(p.routed_ok, routed ? 1 : 0);
      __threadfence();
      signal_release(p.routed, call);
      go = routed;
    }
  } else if (threadIdx.x == 0) {
    // Bounded like every wait; the block it waits for is already running.
    go = wait_signal(p.routed, call, p.timeout_ns, p.error, p.rank, Step::dispatch_send) &&
         *reinterpret_cast<volatile int32_t*>(p.routed_ok) == 1;
  }
  __syncthreads();
  if (!go) return;  // nobody counts in at last_block: its counter stays 0 for the next launch

  const int tokens = tokens_this_call(p);
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
  for (int t = int(ticket); t < tokens; t += gridDim.x) {
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
    const int targets = W + (relay ? N : 0);
    copy_to_each(
        targets, [&](int i) { return slot_at(i) >= 0; }, [&](int i) { return target(i, false); },
        p.x + size_t(t) * payload, payload);
    if (scales)
      copy_to_each(
          targets, [&](int i) { return slot_at(i) >= 0; },
          [&](int i) { return target(i, true); },
          reinterpret_cast<const std::byte*>(p.x_scale) + size_t(t) * scales, scales);
  }
  if (!last_block_all(&p.block_counters[kSendDone])) return;
  if (threadIdx.x == 0) {
    const uint64_t epoch = ++*p.epoch;
    for (int i = 0; i < W; ++i) {
      const int dest = (p.rank + 1 + i) % W;
      if (via_relay(dest)) continue;  // its head travels in the relay block's
      // As if it were dest's region: in_block() maps this rank's block there to where it is built.
      std::byte* region = in_block(dest, lay.count_offset(p.rank)) - lay.count_offset(p.rank);
      store_to_peer(reinterpret_cast<int32_t*>(region + lay.count_offset(p.rank)),
                    p.send_count[dest]);
      // Payloads always travel on this backend.
      store_to_peer(reinterpret_cast<int32_t*>(region + lay.flags_offset(p.rank)), 0);
      for (int e = 0; e < L; ++e)
        store_to_peer(reinterpret_cast<int32_t*>(region + lay.expert_count_offset(p.rank, e)),
                      p.send_expert_count[dest * L + e]);
    }
    for (int node = 0; relay && node < N; ++node) {  // relay heads: each rank's count and counts
      if (node == my_node) continue;
      auto* head = reinterpret_cast<int32_t*>(p.regions[p.rank] + lay.relay_out(node));
      store_to_peer(head, p.relay_count[node]);
      for (int r = 0; r < R; ++r) {
        const int dest = node * R + r;
        store_to_peer(head + lay.relay_head_count(r), p.send_count[dest]);
        for (int e = 0; e < L; ++e)
          store_to_peer(head + lay.relay_head_expert_count(r, e),
                        p.send_expert_count[dest * L + e]);
      }
    }
    __threadfence_system();
    for (int i = 0; i < W; ++i) {
      const int dest = (p.rank + 1 + i) % W;
      if (p.signals[dest]) {
        signal_release(p.signals[dest] + lay.signal_word(lay.dispatch_signal(p.rank)), epoch);
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
  }
  if (p.fuse_recv) {
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
  for (int i = blockIdx.x; i < slots; i += gridDim.x) {
    int source = 0;
    while (p.source_end[source] <= i) ++source;
    const int slot = i - (source > 0 ? p.source_end[source - 1] : 0);
    const auto* header = reinterpret_cast<const int32_t*>(region + lay.token_offset(source, slot));
    const int pairs = header[AllToAllLayout::kHeaderPairs];
    auto row_of = [&](int q) {
      const int e = header[AllToAllLayout::header_expert(q)];
      return e * p.rows_per_expert + p.recv_base[source * L + e] +
             header[AllToAllLayout::header_position(q)];
    };
    auto all = [](int) { return true; };
    copy_to_each(
        pairs, all, [&](int q) { return p.expert_x + size_t(row_of(q)) * payload; },
        region + lay.payload_offset(source, slot), payload);
    if (scales)
      copy_to_each(
          pairs, all,
          [&](int q) {
            return reinterpret_cast<std::byte*>(p.expert_x_scale) + size_t(row_of(q)) * scales;
          },
          region + lay.scale_offset(source, slot), scales);
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
  launch(send_tokens, blocks, stream, p);
}

void launch_dispatch_recv(const AllToAllParams& p, cudaStream_t stream, int blocks, bool waited) {
  if (!waited) launch(route_rows, 1, stream, p);
  launch_dependent(land_rows, blocks, stream, p);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
