// Node-summed combine (AllToAllConfig::combine_sums_in_node, hierarchical mode): a relay sums
// its node's rows of each token it forwarded in dispatch, and puts one row per (token, node).
// Layout: src/all_to_all/layout.hpp ("node sum"); the protocol: docs/gpu-all-to-all.md.
//
//   source s, combine(send), last block of return_rows
//     stage_weights: w[t, j] of each token in node n's relay block, pairs in its header's order
//     put_weights:   weights out [n] -> weights in [s's node] at n's relay, signal 3W + s
//   owner d (every block of return_rows): the row (t, j) of a source s on another node goes by
//     load/store to s's relay on d's node, relay rows [s's node] at (t, j); d's combine signal
//     (W + d) at every rank of its node then covers those rows too
//   relay r, combine(recv)'s one waiting block: sum_for_relayed_sources
//     waits for its node's owners (W + d), then per other node n, in turn from r's own node on:
//     waits for the weights of s = r's peer on n, sums each relay slot's rows in f32 over its
//     pairs (ascending j), rounds once to expert_y's dtype into partial out [n], and puts the
//     block (dtype word + one row per slot) to partial in [r's node] at s with signal W + r
//   source s, reduce_rows: y[t] = sum over nodes in ascending order of the node's partial (its
//     own node's summed there in f32), in f32, rounded once to out_dtype
#pragma once

#include "cuda/all_to_all/row_math.cuh"  // first: see params.cuh
#include "cuda/transport/transport.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

// The node of expert `expert`, for a world of `ranks_per_node` ranks of `local` experts.
__device__ __forceinline__ int node_of_expert(const AllToAllLayout& lay, int expert) {
  return expert / (lay.num_local_experts * lay.ranks_per_node);
}

// Owner side: where the row of `route`, whose source is on another node, goes: that source's
// relay on this rank's node (load/store), at the row's (token, top-k slot) in its relay rows.
__device__ __forceinline__ std::byte* relay_row_for(const AllToAllParams& p, const Route& route) {
  const AllToAllLayout& lay = p.layout;
  const int R = lay.ranks_per_node;
  return p.regions[lay.peer_on_node(route.source, p.rank / R)] +
         lay.relay_row(route.source / R, route.token, route.slot);
}

// Source side, a collective of the block: each token's weights for every other node it went to,
// at its slot in that node's relay block (relay_slot, from dispatch's routing), in the order of
// that slot's triples (ascending j over the slots dispatch sent there).
__device__ void stage_weights(const AllToAllParams& p) {
  const AllToAllLayout& lay = p.layout;
  const int N = lay.nodes, k = p.top_k, E = p.num_local_experts * p.world_size;
  const int my_node = p.rank / lay.ranks_per_node;
  const int tokens = min(tokens_this_call(p), p.round->dispatched_m);
  std::byte* region = p.regions[p.rank];
  for (int t = threadIdx.x; t < tokens; t += blockDim.x) {
    const int32_t* row = p.indices + size_t(t) * k;
    for (int node = 0; node < N; ++node) {
      const int slot = p.relay_slot[t * N + node];
      if (node == my_node || slot < 0) continue;
      int pair = 0;
      for (int j = 0; j < k; ++j) {
        if (!first_in_group(row, j, E, 1) || node_of_expert(lay, row[j]) != node) continue;
        store_to_peer(reinterpret_cast<float*>(region + lay.weights_out(node, slot, pair++)),
                      p.weights[size_t(t) * k + j]);
      }
    }
  }
}

// Source side, one thread (after the block's stage_weights and a barrier): each other node's
// weights to this rank's relay there, with its weights signal; a lone signal when no token went
// there. The caller flushes.
__device__ void put_weights(const AllToAllParams& p) {
  const AllToAllLayout& lay = p.layout;
  const int my_node = p.rank / lay.ranks_per_node;
  __threadfence_system();  // the block's staged weights, before the puts read them
  for (int n = 1; n < lay.nodes; ++n) {
    const int node = (my_node + n) % lay.nodes, relay = lay.peer_on_node(p.rank, node);
    const int slots = p.relay_count[node];
    const bool sent = slots > 0 ? put_signal(p.transport, relay, lay.weights_in(my_node, 0, 0),
                                             lay.weights_out(node, 0, 0), lay.weights_bytes(slots),
                                             lay.weights_signal(p.rank))
                                : signal_add(p.transport, relay, lay.weights_signal(p.rank));
    if (!sent) report(p.error, kNoRemote, relay, Step::combine_send);
  }
}

// Relay side: the partial sums of the source on `node` (this rank's peer there), into partial
// out [node]. A collective of the block.
template <typename In>
__device__ void sum_relay_block(const AllToAllParams& p, int node) {
  const AllToAllLayout& lay = p.layout;
  std::byte* region = p.regions[p.rank];
  const size_t row_bytes = size_t(p.hidden_dim) * sizeof(In), block = lay.relay_in(node);
  const int slots = *reinterpret_cast<const int32_t*>(region + block);
  for (int q = 0; q < slots; ++q) {
    const auto* header = reinterpret_cast<const int32_t*>(region + lay.relay_token_offset(block, q));
    const int t = header[AllToAllLayout::kHeaderToken], pairs = header[AllToAllLayout::kHeaderPairs];
    auto* out = reinterpret_cast<In*>(region + AllToAllLayout::partial_row(lay.partial_out(node), q,
                                                                           row_bytes));
    for (int h = threadIdx.x; h < p.hidden_dim; h += blockDim.x) {
      float acc[1] = {0.0f};
      for (int x = 0; x < pairs; ++x) {
        const int j = header[lay.relay_header_slot(x)];
        const float w = *reinterpret_cast<const float*>(region + lay.weights_in(node, q, x));
        add_scaled(acc, reinterpret_cast<const In*>(region + lay.relay_row(node, t, j)), h, w);
      }
      In rounded;
      store(&rounded, 0, acc[0]);
      store_to_peer(out + h, rounded);
    }
  }
}

// combine(recv)'s waiting block at a relay, before its own waits: the partial sums of every
// source it forwarded for in dispatch, put to each. A collective of the block; sets `failed` if a
// wait fails or an owner's expert_y has another dtype.
__device__ void sum_for_relayed_sources(const AllToAllParams& p, uint64_t epoch, bool& failed) {
  const AllToAllLayout& lay = p.layout;
  const int R = lay.ranks_per_node, my_node = p.rank / R;
  std::byte* region = p.regions[p.rank];
  for (int i = threadIdx.x; i < R && !failed; i += blockDim.x) {  // this node's owners' rows
    const int owner = my_node * R + i;
    if (!wait_signal(p.transport, lay.combine_signal(owner), epoch, p.timeout_ns, p.error, owner,
                     Step::combine_recv)) {
      failed = true;
    } else {
      const int32_t dtype =
          *reinterpret_cast<const volatile int32_t*>(region + lay.combine_dtype_slot(owner));
      if (dtype != p.y_dtype) {
        report(p.error, kDtypeMismatch, owner, Step::combine_recv, dtype);
        failed = true;
      }
    }
  }
  __syncthreads();
  if (failed) return;  // the same for every thread: written before the barrier
  for (int n = 1; n < lay.nodes; ++n) {
    const int node = (my_node + n) % lay.nodes, source = lay.peer_on_node(p.rank, node);
    if (threadIdx.x == 0 && !wait_signal(p.transport, lay.weights_signal(source), epoch,
                                         p.timeout_ns, p.error, source, Step::combine_recv,
                                         kAwaitedWeights))
      failed = true;
    __syncthreads();
    if (failed) break;
    switch (DType(p.y_dtype)) {
      case DType::f32: sum_relay_block<float>(p, node); break;
      case DType::bf16: sum_relay_block<__nv_bfloat16>(p, node); break;
      default: sum_relay_block<__half>(p, node); break;  // the host admits no other
    }
    __syncthreads();  // every row of the block, before thread 0 puts it
    if (threadIdx.x == 0) {
      const size_t block = lay.partial_out(node);
      const int slots = *reinterpret_cast<const int32_t*>(region + lay.relay_in(node));
      store_to_peer(reinterpret_cast<int32_t*>(region + block), int32_t(p.y_dtype));
      __threadfence_system();  // the block's rows and the dtype, before the put reads them
      if (!put_signal(p.transport, source, lay.partial_in(my_node), block,
                      AllToAllLayout::partial_bytes(slots, size_t(p.hidden_dim) * p.y_elem_bytes),
                      lay.combine_signal(p.rank)))
        report(p.error, kNoRemote, source, Step::combine_recv);
    }
  }
  // The partial blocks are rewritten by the next combine: this thread issued every put.
  if (threadIdx.x == 0) flush(p.transport);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
