// AllToAll's node-summed combine (combine_sums_in_node) on the emulated device only, W ranks
// sharing it as 2x2, 2x4 and 4x2 nodes: the cases within their bound and the same bits every
// run, the edges and split phases; refused without hierarchical mode; a relay waiting for a
// source's weights names it. On a GPU build this file holds no test.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "all_to_all_cases.hpp"
#include "cuda/cuda_all_to_all_test_helpers.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {
namespace {

using reference::Routing;

#if !defined(PMOE_TEST_ON_GPU)
// Node-summed combine (combine_sums_in_node) on the emulated 2x2, 2x4 and 4x2 splits: each case
// within the bound derived in tests/all_to_all_cases.cpp (compare_node_summed), in bf16, f32 and
// f16 expert outputs; the same bytes on a second run; the edges (no tokens on odd ranks, -1
// slots, top-k = E, odd rows) and split phases. Its network bytes: test_cuda_all_to_all_traffic.
class NodeSummedCombine : public ::testing::TestWithParam<Topology> {
 protected:
  void SetUp() override { PMOE_REQUIRE_CUDA_RUNTIME(); }
  AllToAllCase base(int top_k = 3, int hidden = 64) const {
    const int W = GetParam().ranks;
    AllToAllCase c;
    c.config = make_config(9, 2 * W, std::min(top_k, 2 * W), hidden);
    c.config.ranks_per_node = GetParam().per_node;
    c.config.cross_node = CrossNode::hierarchical;
    c.config.combine_sums_in_node = true;
    c.calls = 2;
    c.device = Device::cuda(0);
    return c;
  }
  // The case's digest (every output byte of every call), after expecting it to pass.
  uint64_t run(const AllToAllCase& c) const {
    const int W = GetParam().ranks;
    std::vector<CaseResult> results(static_cast<size_t>(W));
    run_ranks(W, [&](Communicator& comm) {
      results[size_t(comm.rank())] = run_all_to_all_case(comm, c);
    }, Device::cuda(0));
    uint64_t digest = 0;
    for (int r = 0; r < W; ++r) {
      EXPECT_EQ(results[size_t(r)].error, "") << describe(c);
      EXPECT_GT(results[size_t(r)].remote_bytes, 0u) << "rank " << r << " sent nothing off-node";
      digest = digest * 31 + results[size_t(r)].digest;
    }
    return digest;
  }
};

TEST_P(NodeSummedCombine, WithinTheBoundAndTheSameBitsEveryRun) {
  AllToAllCase c = base(4);
  for (DType expert_y : {DType::bf16, DType::f32, DType::f16}) {
    c.config.in_dtype = expert_y == DType::f32 ? DType::f32 : DType::bf16;
    c.config.out_dtype = expert_y == DType::bf16 ? DType::bf16 : DType::f32;
    c.expert_y_dtype = expert_y;
    SCOPED_TRACE(dtype_name(expert_y));
    EXPECT_EQ(run(c), run(c)) << "two runs of the same case differ";
  }
}

TEST_P(NodeSummedCombine, EdgeCases) {
  AllToAllCase zero = base();
  zero.tokens = TokenCounts::zero_on_odd;
  run(zero);
  AllToAllCase dropped = base();
  dropped.routing = Routing::dropped;
  run(dropped);
  AllToAllCase all_experts = base();
  all_experts.config.top_k = all_experts.config.num_experts;
  all_experts.tokens = TokenCounts::full;
  run(all_experts);
  AllToAllCase odd = base(2, 7);  // rows that are not a multiple of 16 bytes: the scalar path
  odd.config.out_dtype = DType::f16;
  run(odd);
  AllToAllCase split = base();
  split.split_phases = true;
  split.calls = 4;
  run(split);
}

INSTANTIATE_TEST_SUITE_P(Splits, NodeSummedCombine,
                         ::testing::Values(Topology{4, 2}, Topology{8, 4}, Topology{8, 2}),
                         [](const auto& info) {
                           const Topology t = info.param;
                           return "Nodes" + std::to_string(t.ranks / t.per_node) + "x" +
                                  std::to_string(t.per_node);
                         });

// The option without hierarchical mode is refused at construction, on every rank, before
// anything is allocated.
TEST(NodeSummedCombineConfig, WithoutHierarchicalModeIsAnError) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  std::vector<std::string> errors(2);
  run_ranks(2, [&](Communicator& comm) {
    AllToAllConfig cfg = make_config(4, 4, 2, 32);
    cfg.ranks_per_node = 1;
    cfg.combine_sums_in_node = true;
    try {
      AllToAll a2a(comm, cfg);
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  }, Device::cuda(0));
  for (const std::string& e : errors)
    EXPECT_NE(e.find("combine_sums_in_node is an option of cross_node = hierarchical"),
              std::string::npos)
        << e;
}

// Two nodes of two; rank 3 dispatches but never combines. Rank 1, rank 3's relay on node 0,
// waits for rank 3's weights to sum node 0's rows for it: after the timeout it names rank 3,
// its node, and what it waited for; rank 0 names its relay on node 1, rank 2, which waited for
// rank 3's rows in vain.
TEST(NodeSummedCombineConfig, RelayWithoutASourcesWeightsTimesOutNamingIt) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  setenv("PMOE_TIMEOUT_S", "1", 1);
  std::vector<std::string> errors(4);
  run_ranks(4, [&](Communicator& comm) {
    AllToAllConfig cfg = make_config(4, 8, 2, 32);
    cfg.ranks_per_node = 2;
    cfg.cross_node = CrossNode::hierarchical;
    cfg.combine_sums_in_node = true;
    AllToAll a2a(comm, cfg);
    const auto in = reference::make_inputs(cfg, comm.rank(), 4, 3, Routing::random);
    const Device gpu = comm.device();
    auto [x, indices, weights] = inputs_on(in, gpu);
    Buffer counts(DType::i32, {2}, gpu), expert_x(DType::bf16, {2, 16, 32}, gpu),
        y(DType::bf16, {in.m, 32}, gpu);
    try {
      a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor());
      synchronize(comm.stream());
      a2a.check_errors();
      comm.barrier();  // every dispatch is over: only combine's waits can fail below
      if (comm.rank() == 3) return;
      a2a.combine(expert_x, indices, weights, y);
      synchronize(comm.stream());
      a2a.check_errors();
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  }, Device::cuda(0));
  unsetenv("PMOE_TIMEOUT_S");
  EXPECT_NE(errors[1].find("rank 3 (node 1; this rank is on node 0) did not arrive within 1 s"),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[1].find("this rank waited for the weights of its tokens, to sum node 0's rows "
                           "of them"),
            std::string::npos)
      << errors[1];
  // Rank 2, rank 0's relay on node 1, never gets rank 3's rows, so rank 0 never gets node 1's
  // partial sums of its tokens: it names rank 2 and what it waited for.
  EXPECT_NE(errors[0].find("rank 2 (node 1; this rank is on node 0) did not arrive within 1 s; "
                           "this rank waited for node 1's partial sums of its tokens"),
            std::string::npos)
      << errors[0];
}
#endif

}  // namespace
}  // namespace pmoe::testing
