// W thread ranks sharing the emulated GPU, split into nodes (2x2, 2x4, 4x2): what each rank's
// CUDA dispatch and combine really put to other nodes (AllToAll::remote_traffic(), counted by
// the emulated remote path's proxy) equals count_traffic's network bytes and transfers for that
// rank (src/all_to_all/traffic.hpp), on uniform and Zipf-skewed routings with -1 slots, m varying
// per rank and call (0 included), in several dtypes. Each cross-node mode is one parameter
// (node_sum: hierarchical with combine_sums_in_node, counted with relay_reduces); at top-8,
// node-summed combine puts fewer bytes than direct combine on every rank.
// Emulated device only: on a GPU the remote path is NCCL GIN across real nodes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "all_to_all/traffic.hpp"
#include "all_to_all_cases.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"

namespace pmoe::testing {
namespace {

using detail::Link;
using detail::LinkCount;
using detail::TrafficMode;

// How tokens cross nodes: the config change that selects it and count_traffic's mode.
struct Crossing {
  const char* name;
  TrafficMode traffic;
  void (*select)(AllToAllConfig&);
  bool sums_in_node = false;  // count_traffic's relay_reduces
};
const Crossing kDirect{"direct", TrafficMode::direct, [](AllToAllConfig&) {}};
const Crossing kHierarchical{"hierarchical", TrafficMode::hierarchical, [](AllToAllConfig& c) {
                                c.cross_node = ::pmoe::CrossNode::hierarchical;
                              }};
const Crossing kNodeSum{"node_sum", TrafficMode::hierarchical,
                        [](AllToAllConfig& c) {
                          c.cross_node = ::pmoe::CrossNode::hierarchical;
                          c.combine_sums_in_node = true;
                        },
                        true};

struct Split {
  int nodes, per_node;
};

struct Param {
  Split split;
  Crossing mode;
};
void PrintTo(const Param& p, std::ostream* out) {
  *out << p.split.nodes << "x" << p.split.per_node << " " << p.mode.name;
}

struct Dtypes {
  DType in, expert_y, out;
  int scale_block;
};

// m tokens per rank (each rank its own m in [0, max], rank 1 always 0), k distinct experts per
// token, expert e drawn with weight 1 / (e + 1)^zipf (0: uniform), each slot -1 with
// probability 1/6.
std::vector<std::vector<int32_t>> make_routing(int W, int max_tokens, int k, int E, double zipf,
                                               std::mt19937& rng) {
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(W));
  std::uniform_int_distribution<int> tokens(0, max_tokens), hole(0, 5);
  for (int r = 0; r < W; ++r) {
    const int m = r == 1 ? 0 : tokens(rng);
    for (int t = 0; t < m; ++t) {
      std::vector<double> weights(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) weights[size_t(e)] = 1.0 / std::pow(e + 1.0, zipf);
      for (int j = 0; j < k; ++j) {
        std::discrete_distribution<int> pick(weights.begin(), weights.end());
        const int e = pick(rng);
        weights[size_t(e)] = 0;  // distinct within the row
        out[size_t(r)].push_back(hole(rng) == 0 ? -1 : e);
      }
    }
  }
  return out;
}

class AllToAllCudaTraffic : public ::testing::TestWithParam<Param> {};

TEST_P(AllToAllCudaTraffic, RemoteTrafficEqualsCountTraffic) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const Param p = GetParam();
  const int W = p.split.nodes * p.split.per_node, k = 3, max_tokens = 6, H = 80;
  const Dtypes dtypes[] = {{DType::bf16, DType::bf16, DType::bf16, 0},
                           {DType::f8e4m3, DType::f32, DType::f16, 16},
                           {DType::f32, DType::f16, DType::f32, 0}};
  std::mt19937 rng(uint32_t(W * 100 + p.split.per_node));
  for (double zipf : {0.0, 1.5}) {
    for (const Dtypes& d : dtypes) {
      AllToAllConfig cfg = make_config(max_tokens, 2 * W, k, H, d.in, d.out, d.scale_block);
      cfg.ranks_per_node = p.split.per_node;
      p.mode.select(cfg);
      const int L = cfg.num_experts / W, S = cfg.scales_per_token();
      const std::string where = detail::cat("zipf ", zipf, ", in ", dtype_name(d.in),
                                            ", expert_y ", dtype_name(d.expert_y));
      // Two calls on one op, each with its own routing: the counters are read around each step.
      std::vector<std::vector<std::vector<int32_t>>> routings;
      for (int call = 0; call < 2; ++call)
        routings.push_back(make_routing(W, max_tokens, k, cfg.num_experts, zipf, rng));
      struct Seen {
        AllToAll::RemoteTraffic dispatch, combine;
        int64_t rows = 0;
        std::string error;
      };
      std::vector<std::vector<Seen>> seen(2, std::vector<Seen>(size_t(W)));
      run_ranks(W, [&](Communicator& comm) {
        const int rank = comm.rank();
        const Device gpu = comm.device();
        AllToAll a2a(comm, cfg);
        Buffer x(d.in, {max_tokens, H}, gpu), x_scale(DType::f32, {max_tokens, std::max(S, 1)}, gpu),
            indices(DType::i32, {max_tokens, k}, gpu), weights(DType::f32, {max_tokens, k}, gpu),
            counts(DType::i32, {L}, gpu), expert_x(d.in, {L, W * max_tokens, H}, gpu),
            expert_x_scale(DType::f32, {L, W * max_tokens, std::max(S, 1)}, gpu),
            expert_y(d.expert_y, {L, W * max_tokens, H}, gpu), y(d.out, {max_tokens, H}, gpu);
        Buffer host_counts(DType::i32, {L});
        for (int call = 0; call < 2; ++call) {
          Seen& mine = seen[size_t(call)][size_t(rank)];
          const std::vector<int32_t>& rows = routings[size_t(call)][size_t(rank)];
          const int64_t m = int64_t(rows.size()) / k;
          std::vector<int32_t> host_rows = rows;
          const Tensor indices_m(indices.data<void>(), DType::i32, {m, k}, gpu);
          copy(indices_m, Tensor(host_rows.data(), DType::i32, {m, k}));
          const Tensor x_m(x.data<void>(), d.in, {m, H}, gpu),
              scale_m = S ? Tensor(x_scale.data<void>(), DType::f32, {m, S}, gpu) : Tensor(),
              expert_x_scale_arg = S ? Tensor(expert_x_scale.data<void>(), DType::f32,
                                              {L, W * max_tokens, S}, gpu)
                                     : Tensor(),
              weights_m(weights.data<void>(), DType::f32, {m, k}, gpu),
              y_m(y.data<void>(), d.out, {m, H}, gpu);
          try {
            const auto before = a2a.remote_traffic();
            a2a.dispatch(x_m, scale_m, indices_m, counts, expert_x, expert_x_scale_arg);
            synchronize(comm.stream());
            a2a.check_errors();
            const auto dispatched = a2a.remote_traffic();
            copy(host_counts, counts);
            for (int e = 0; e < L; ++e) mine.rows += host_counts.data<int32_t>()[e];
            a2a.combine(expert_y, indices_m, weights_m, y_m);
            synchronize(comm.stream());
            a2a.check_errors();
            const auto combined = a2a.remote_traffic();
            mine.dispatch = {dispatched.bytes - before.bytes,
                             dispatched.transfers - before.transfers};
            mine.combine = {combined.bytes - dispatched.bytes,
                            combined.transfers - dispatched.transfers};
          } catch (const Error& e) {
            mine.error = e.what();
          }
        }
      }, Device::cuda(0));
      for (int call = 0; call < 2; ++call) {
        const detail::Traffic counted =
            detail::count_traffic(cfg, {W, p.split.per_node, p.mode.traffic, p.mode.sums_in_node},
                                  routings[size_t(call)], d.expert_y);
        uint64_t network = 0;
        for (int r = 0; r < W; ++r) {
          SCOPED_TRACE(detail::cat(where, ", call ", call, ", rank ", r));
          const Seen& s = seen[size_t(call)][size_t(r)];
          ASSERT_EQ(s.error, "");
          const LinkCount want_d = counted.dispatch.ranks[size_t(r)].sent[int(Link::network)];
          const LinkCount want_c = counted.combine.ranks[size_t(r)].sent[int(Link::network)];
          EXPECT_EQ(s.dispatch.bytes, want_d.bytes) << "dispatch bytes";
          EXPECT_EQ(s.dispatch.transfers, want_d.transfers) << "dispatch transfers";
          EXPECT_EQ(s.combine.bytes, want_c.bytes) << "combine bytes";
          EXPECT_EQ(s.combine.transfers, want_c.transfers) << "combine transfers";
          EXPECT_EQ(uint64_t(s.rows), counted.dispatch.ranks[size_t(r)].rows) << "rows landed";
          network += s.dispatch.bytes + s.combine.bytes;
        }
        EXPECT_GT(network, 0u) << "nothing crossed a node: the split was not used";
      }
    }
  }
}

// Per rank, what one dispatch + combine of `routing` (bf16 throughout, H 64) put off-node in
// combine alone.
std::vector<uint64_t> combine_network_bytes(const AllToAllConfig& cfg,
                                            const std::vector<std::vector<int32_t>>& routing) {
  const int W = int(routing.size()), k = cfg.top_k, H = cfg.hidden_dim;
  const int M = cfg.max_tokens, L = cfg.num_experts / W;
  std::vector<uint64_t> bytes(size_t(W), 0);
  run_ranks(W, [&](Communicator& comm) {
    const Device gpu = comm.device();
    AllToAll a2a(comm, cfg);
    std::vector<int32_t> rows = routing[size_t(comm.rank())];
    const int64_t m = int64_t(rows.size()) / k;
    Buffer x(DType::bf16, {M, H}, gpu), indices(DType::i32, {M, k}, gpu),
        weights(DType::f32, {M, k}, gpu), counts(DType::i32, {L}, gpu),
        expert_x(DType::bf16, {L, W * M, H}, gpu), y(DType::bf16, {M, H}, gpu);
    const Tensor indices_m(indices.data<void>(), DType::i32, {m, k}, gpu);
    copy(indices_m, Tensor(rows.data(), DType::i32, {m, k}));
    a2a.dispatch(Tensor(x.data<void>(), DType::bf16, {m, H}, gpu), Tensor(), indices_m, counts,
                 expert_x, Tensor());
    synchronize(comm.stream());
    const uint64_t before = a2a.remote_traffic().bytes;
    a2a.combine(expert_x, indices_m, Tensor(weights.data<void>(), DType::f32, {m, k}, gpu),
                Tensor(y.data<void>(), DType::bf16, {m, H}, gpu));
    synchronize(comm.stream());
    a2a.check_errors();
    bytes[size_t(comm.rank())] = a2a.remote_traffic().bytes - before;
  }, Device::cuda(0));
  return bytes;
}

// At top-8 over two nodes of four, node-summed combine puts fewer bytes off-node than combine
// returning rows directly, on every rank: one row per (token, node) instead of one per
// (token, expert), weights and heads included.
TEST(AllToAllCudaTraffic, NodeSumPutsFewerBytesThanDirectCombineAtTop8) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  std::mt19937 rng(32);
  AllToAllConfig cfg = make_config(8, 16, 8, 64);
  cfg.ranks_per_node = 4;
  cfg.cross_node = ::pmoe::CrossNode::hierarchical;
  const auto routing = make_routing(8, 8, 8, 16, 0.0, rng);
  const std::vector<uint64_t> direct = combine_network_bytes(cfg, routing);
  cfg.combine_sums_in_node = true;
  const std::vector<uint64_t> summed = combine_network_bytes(cfg, routing);
  for (int r = 0; r < 8; ++r) {
    EXPECT_GT(direct[size_t(r)], 0u) << "rank " << r;
    EXPECT_LT(summed[size_t(r)], direct[size_t(r)]) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Splits, AllToAllCudaTraffic,
                         ::testing::Values(Param{{2, 2}, kDirect}, Param{{2, 4}, kDirect},
                                           Param{{4, 2}, kDirect}, Param{{2, 2}, kHierarchical},
                                           Param{{2, 4}, kHierarchical},
                                           Param{{4, 2}, kHierarchical}, Param{{2, 2}, kNodeSum},
                                           Param{{2, 4}, kNodeSum}, Param{{4, 2}, kNodeSum}),
                         [](const auto& info) {
                           const Param& p = info.param;
                           return detail::cat("Nodes", p.split.nodes, "x", p.split.per_node, "_",
                                              p.mode.name);
                         });

}  // namespace
}  // namespace pmoe::testing
