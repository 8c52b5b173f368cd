// Counts what AllToAll moves for a routing; the assumptions are at the top of traffic.hpp.
#include "all_to_all/traffic.hpp"

#include <algorithm>
#include <tuple>

#include "all_to_all/layout.hpp"
#include "all_to_all/route.hpp"
#include "pmoe/dtype.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {

const char* link_name(Link link) {
  switch (link) {
    case Link::same_rank:
      return "same_rank";
    case Link::load_store:
      return "load_store";
    case Link::network:
      return "network";
  }
  return "?";
}

const char* mode_name(TrafficMode mode) {
  return mode == TrafficMode::direct ? "direct" : "hierarchical";
}

LinkCount OpTraffic::total(Link link) const {
  LinkCount sum;
  for (const RankTraffic& r : ranks) {
    sum.bytes += r.sent[int(link)].bytes;
    sum.transfers += r.sent[int(link)].transfers;
  }
  return sum;
}

uint64_t OpTraffic::signals(Link link) const {
  uint64_t sum = 0;
  for (const RankTraffic& r : ranks) sum += r.signals_sent[int(link)];
  return sum;
}

namespace {

void check_setup(const AllToAllConfig& config, const TrafficSetup& setup,
                 const std::vector<std::vector<int32_t>>& indices, DType expert_y_dtype) {
  const int W = setup.world_size;
  PMOE_CHECK(W >= 1, "count_traffic: world_size must be >= 1, got ", W);
  PMOE_CHECK(setup.ranks_per_node >= 1 && W % setup.ranks_per_node == 0,
             "count_traffic: ranks_per_node must divide world_size ", W, ", got ",
             setup.ranks_per_node);
  config.validate(W);
  PMOE_CHECK(expert_y_dtype == DType::f32 || expert_y_dtype == DType::bf16 ||
                 expert_y_dtype == DType::f16,
             "count_traffic: expert_y_dtype must be f32, bf16 or f16, got ",
             dtype_name(expert_y_dtype));
  PMOE_CHECK(indices.size() == size_t(W), "count_traffic: indices must hold one routing per rank (",
             W, "), got ", indices.size());
  const int k = config.top_k, E = config.num_experts;
  for (int r = 0; r < W; ++r) {
    const auto& rows = indices[r];
    PMOE_CHECK(rows.size() % size_t(k) == 0 && rows.size() / k <= size_t(config.max_tokens),
               "count_traffic: indices[", r, "] must hold m * ", k,
               " entries with m <= ", config.max_tokens, ", got ", rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      PMOE_CHECK(rows[i] >= -1 && rows[i] < E, "count_traffic: indices[", r, "][", i,
                 "] must be -1 or an expert in [0, ", E, "), got ", rows[i]);
  }
}

// Who is on the critical path: the most network bytes (sent or received), then load/store.
int critical_rank(const OpTraffic& op) {
  auto key = [](const RankTraffic& r) {
    auto most = [&](Link l) { return std::max(r.sent[int(l)].bytes, r.received[int(l)].bytes); };
    return std::make_tuple(most(Link::network), most(Link::load_store));
  };
  int best = 0;
  for (int r = 1; r < int(op.ranks.size()); ++r)
    if (key(op.ranks[r]) > key(op.ranks[best])) best = r;
  return best;
}

}  // namespace

Traffic count_traffic(const AllToAllConfig& config, const TrafficSetup& setup,
                      const std::vector<std::vector<int32_t>>& indices) {
  return count_traffic(config, setup, indices, config.out_dtype);
}

Traffic count_traffic(const AllToAllConfig& config, const TrafficSetup& setup,
                      const std::vector<std::vector<int32_t>>& indices, DType expert_y_dtype) {
  check_setup(config, setup, indices, expert_y_dtype);
  const int W = setup.world_size, P = setup.ranks_per_node;
  const bool hierarchical = setup.mode == TrafficMode::hierarchical;
  // The layout the kernels would have for this split and mode (its relay blocks' sizes).
  AllToAllConfig split = config;
  split.ranks_per_node = P;
  split.cross_node = hierarchical ? CrossNode::hierarchical : CrossNode::direct;
  const AllToAllLayout lay(split, W);
  const int E = config.num_experts, k = config.top_k, L = lay.num_local_experts;
  const uint64_t body = lay.payload_bytes + lay.scale_bytes;  // a slot past its header
  // One combine row, in expert_y's dtype (the kernels send what expert_y holds).
  const uint64_t row_bytes =
      uint64_t(config.hidden_dim) * dtype_size(expert_y_dtype);
  const uint64_t head_bytes = sizeof(int32_t) * (2 + uint64_t(L));
  const uint64_t dtype_bytes = sizeof(int32_t);
  auto slot_bytes = [&](int pairs) {
    return sizeof(int32_t) * uint64_t(AllToAllLayout::header_ints(pairs)) + body;
  };

  Traffic out;
  out.dispatch.ranks.resize(W);
  out.combine.ranks.resize(W);
  auto link = [&](int from, int to) {
    return from == to ? Link::same_rank : from / P == to / P ? Link::load_store : Link::network;
  };
  auto move = [&](OpTraffic& op, int from, int to, uint64_t bytes) {
    const int l = int(link(from, to));
    op.ranks[from].sent[l].add(bytes);
    op.ranks[to].received[l].add(bytes);
  };
  auto signal = [&](OpTraffic& op, int from, int to) {
    const int l = int(link(from, to));
    ++op.ranks[from].signals_sent[l];
    ++op.ranks[to].signals_received[l];
  };
  auto off_node = [&](int s, int d) { return s / P != d / P; };
  // Dispatch to a rank on another node goes through that node's relay in hierarchical mode.
  auto relayed = [&](int s, int d) { return hierarchical && off_node(s, d); };
  auto relay_of = [&](int s, int node) { return node * P + s % P; };
  // Combine summed by the relay (combine_sums_in_node): what the kernels move in that mode.
  const bool relay_combine = hierarchical && setup.relay_reduces;

  std::vector<int> pairs_on(W);        // this token's (expert, slot) pairs per rank
  std::vector<char> node_done(W / P);  // this token's relay slot on that node is counted
  std::vector<uint64_t> slots_to(W);   // this source's slots per destination (block puts)
  std::vector<uint64_t> relay_slots(W / P);  // and per node's relay block (hierarchical)
  for (int s = 0; s < W; ++s) {
    const int m = int(indices[s].size()) / k;
    std::fill(slots_to.begin(), slots_to.end(), 0);
    std::fill(relay_slots.begin(), relay_slots.end(), 0);
    for (int t = 0; t < m; ++t) {
      const int32_t* row = indices[s].data() + size_t(t) * k;
      std::fill(pairs_on.begin(), pairs_on.end(), 0);
      std::fill(node_done.begin(), node_done.end(), 0);
      for (int j = 0; j < k; ++j)
        if (first_in_group(row, j, E, 1)) ++pairs_on[row[j] / L];
      for (int j = 0; j < k; ++j) {
        if (!first_in_group(row, j, E, L)) continue;  // the first slot that names rank d
        const int d = row[j] / L, n = pairs_on[d], node = d / P, relay = relay_of(s, node);
        out.dispatch.ranks[d].rows += n;
        // Node sum: the relay sums a remote node's rows, the source one partial per such node.
        if (relay_combine && relayed(s, d)) {
          out.combine.ranks[relay].rows += n;
          if (!node_done[node]) ++out.combine.ranks[s].rows;
        } else {
          out.combine.ranks[s].rows += n;
        }
        if (relayed(s, d)) {
          if (!node_done[node]) ++relay_slots[node];
          move(out.dispatch, relay, d, slot_bytes(n));  // the relay rebuilds d's slot
        } else if (off_node(s, d)) {
          ++slots_to[d];
        } else {
          move(out.dispatch, s, d, slot_bytes(n));
        }
        if (relay_combine && relayed(s, d)) {  // to the relay's rows, by load/store
          for (int q = 0; q < n; ++q) move(out.combine, d, relay, row_bytes);
        } else {
          for (int q = 0; q < n; ++q) move(out.combine, d, s, row_bytes);
        }
        node_done[node] = 1;
      }
    }
    // Heads and signals: every rank hears from every source, empty blocks included.
    for (int d = 0; d < W; ++d) {
      const int relay = relay_of(s, d / P);
      if (!relayed(s, d)) {
        move(out.dispatch, s, d,
             off_node(s, d) ? lay.block_head_bytes + slots_to[d] * lay.token_stride : head_bytes);
        signal(out.dispatch, s, d);
      } else {
        if (d == relay) {  // once per remote node: the relay block, whole, in one put
          move(out.dispatch, s, relay,
               lay.relay_head_bytes + relay_slots[d / P] * lay.relay_token_stride);
          signal(out.dispatch, s, relay);
        }
        move(out.dispatch, relay, d, head_bytes);
        signal(out.dispatch, relay, d);
      }
      if (relay_combine && relayed(s, d)) {
        // Its dtype word and signal reach the relay as a rank of d's node (d -> relay), where
        // the loop over sources counts them; s hears from its relay there only, below.
        if (d != relay) continue;
        const uint64_t slots = relay_slots[d / P];
        move(out.combine, s, relay, lay.weights_bytes(int(slots)));  // k weights, or a lone signal
        signal(out.combine, s, relay);
        move(out.combine, relay, s, AllToAllLayout::partial_bytes(int(slots), row_bytes));
        signal(out.combine, relay, s);
      } else {
        move(out.combine, d, s, dtype_bytes);
        signal(out.combine, d, s);
      }
    }
  }
  out.dispatch.critical_rank = critical_rank(out.dispatch);
  out.combine.critical_rank = critical_rank(out.combine);
  return out;
}

}  // namespace pmoe::detail
