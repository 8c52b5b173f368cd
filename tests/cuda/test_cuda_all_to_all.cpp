// AllToAll on the CUDA backend: the CPU tests' cases with W ranks sharing one GPU, checked
// against the same reference, so the two backends give the same bytes: every dtype pair, f8 with
// block scales, the edges, split phases, int64 indices, on one node and (emulated device) split
// into nodes; expert placements and masked ranks. Graphs, errors and the node-summed combine:
// test_cuda_all_to_all_graphs.cpp, _errors.cpp, _node_summed.cpp, built into the same program.
// Built twice: for the emulated device (runs everywhere) and for a GPU
// (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "all_to_all_cases.hpp"
#include "all_to_all_mask_cases.hpp"
#include "cuda/cuda_all_to_all_test_helpers.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "pmoe/comm.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {
namespace {

using reference::Routing;

void expect_case_on_gpu(int W, AllToAllCase c) {
  c.device = Device::cuda(0);
  std::vector<CaseResult> results(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) { results[size_t(comm.rank())] = run_all_to_all_case(comm, c); },
            Device::cuda(0));
  uint64_t remote = 0;
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(results[size_t(r)].error, "") << "W = " << W;
    remote += results[size_t(r)].remote_bytes;
  }
  // A split world: off-node peers have no pointer, so the bytes must have gone through the
  // remote path (the emulated proxy) or the case could not have matched.
  const int per_node = c.config.ranks_per_node;
  if (per_node > 0 && per_node < W) {
    EXPECT_GT(remote, 0u) << "nothing went through the remote path";
  }
}

class AllToAllCuda : public ::testing::TestWithParam<Topology> {
 protected:
  void SetUp() override { PMOE_REQUIRE_CUDA_RUNTIME(); }
  int W() const { return GetParam().ranks; }
  AllToAllCase base(int top_k = 3, int hidden = 64) const {
    AllToAllCase c;
    c.config = make_config(9, 2 * W(), std::min(top_k, 2 * W()), hidden);
    c.config.ranks_per_node = GetParam().per_node;
    c.config.cross_node = GetParam().cross_node;
    c.calls = 3;
    return c;
  }
  // f8e4m3 tokens with 128-element block scales, expert outputs in bf16.
  static AllToAllCase with_f8(AllToAllCase c) {
    c.config.in_dtype = DType::f8e4m3;
    c.config.scale_block = 128;
    c.expert_y_dtype = DType::bf16;
    return c;
  }
};

TEST_P(AllToAllCuda, RandomRoutingEveryDtype) {
  for (DType in : {DType::f32, DType::bf16, DType::f16}) {
    for (DType out : {DType::f32, DType::bf16, DType::f16}) {
      AllToAllCase c = base();
      c.config.in_dtype = in;
      c.config.out_dtype = out;
      c.expert_y_dtype = in;
      expect_case_on_gpu(W(), c);
    }
  }
}

TEST_P(AllToAllCuda, F8WithBlockScales) {
  expect_case_on_gpu(W(), with_f8(base(3, 256)));
}

TEST_P(AllToAllCuda, EdgeCases) {
  AllToAllCase zero = base();
  zero.tokens = TokenCounts::zero_on_odd;
  expect_case_on_gpu(W(), zero);
  AllToAllCase hot = base();
  hot.routing = Routing::hot_expert;
  hot.tokens = TokenCounts::full;
  expect_case_on_gpu(W(), hot);
  AllToAllCase dropped = base();
  dropped.routing = Routing::dropped;
  expect_case_on_gpu(W(), dropped);
  AllToAllCase all_experts = base();
  all_experts.config.top_k = all_experts.config.num_experts;
  expect_case_on_gpu(W(), all_experts);
  AllToAllCase odd = base(2, 7);  // rows that are not a multiple of 16 bytes
  odd.config.in_dtype = DType::f16;
  odd.expert_y_dtype = DType::f16;
  expect_case_on_gpu(W(), odd);
  // f8 rows of 9 bytes with 3 scales each: rows and scale blocks at every byte alignment, so the
  // copies take their byte and narrow-word paths (a 16-byte access there traps: emulated-device.md)
  AllToAllCase odd_f8 = with_f8(base(2, 9));
  odd_f8.config.scale_block = 3;
  odd_f8.calls = 1;
  expect_case_on_gpu(W(), odd_f8);
}

// Odd hidden sizes in every dtype pair the combine reads and writes: rows whose vector body and
// scalar tail meet inside one row, at every alignment the pairs give.
TEST_P(AllToAllCuda, OddHiddenSizesEveryDtypePair) {
  for (int hidden : {9, 13}) {
    for (DType in : {DType::f32, DType::bf16}) {
      for (DType out : {DType::f32, DType::bf16, DType::f16}) {
        AllToAllCase c = base(2, hidden);
        c.config.in_dtype = in;
        c.config.out_dtype = out;
        c.expert_y_dtype = in;
        c.calls = 1;
        expect_case_on_gpu(W(), c);
      }
    }
  }
}

// More experts than send_tokens counts in __shared__ at once (2048 a pass): 2056 local experts a
// rank, so its routing takes two passes at W = 1 and up to nine at W = 8; every token chooses the
// last expert, in the last pass, so its rows' positions there count tokens of other blocks.
TEST_P(AllToAllCuda, MoreLocalExpertsThanOneRankingPass) {
  AllToAllCase c = base(4, 32);
  c.config.num_experts = 2056 * W();
  c.routing = Routing::hot_last_expert;
  c.calls = 2;
  expect_case_on_gpu(W(), c);
}

// More tokens and routes than the kernels have blocks (2 per SM), and rows longer than a block's
// threads, so every grid-stride and block-stride loop runs more than once; f8 rows with 3 scales
// (12 bytes: the scales take the byte-wise copy).
TEST_P(AllToAllCuda, MoreWorkThanBlocks) {
  AllToAllCase wide = base(4, 1032);
  wide.config.max_tokens = 300;
  wide.tokens = TokenCounts::full;
  wide.calls = 2;
  expect_case_on_gpu(W(), wide);
  AllToAllCase f8 = with_f8(base(3, 384));
  f8.config.max_tokens = 300;
  expect_case_on_gpu(W(), f8);
}

TEST_P(AllToAllCuda, SplitPhasesAndManyCalls) {
  AllToAllCase c = base();
  c.split_phases = true;
  c.calls = 50;
  expect_case_on_gpu(W(), c);
}

// torch.topk's int64 indices, narrowed on the device: the same results as int32, whole and split.
TEST_P(AllToAllCuda, Int64Indices) {
  AllToAllCase c = base();
  c.routing = Routing::dropped;
  c.i64_indices = true;
  expect_case_on_gpu(W(), c);
  c.split_phases = true;
  expect_case_on_gpu(W(), c);
  // More indices (1100 x top-k >= 2200) than the narrowing kernel's grid has threads (8 x 256).
  AllToAllCase many = base(4, 16);
  many.config.max_tokens = 1100;
  many.tokens = TokenCounts::full;
  many.i64_indices = true;
  many.calls = 1;
  expect_case_on_gpu(W(), many);
}

// The node splits run on the emulated device only: there the off-node peers go through its proxy.
// On a GPU the ranks of a test share that one GPU, and NCCL gives GIN one rank of a communicator
// per GPU, so a split is refused (OnOneGpuANodeSplitIsRefusedByName); scripts/device_checks.sh's
// gin part runs the remote path across processes instead.
INSTANTIATE_TEST_SUITE_P(Ranks, AllToAllCuda,
                         ::testing::Values(Topology{1, 0}, Topology{2, 0}, Topology{4, 0},
                                           Topology{8, 0}
#if !defined(PMOE_TEST_ON_GPU)
                                           , Topology{4, 2}, Topology{8, 4}, Topology{8, 2},
                                           Topology{4, 2, CrossNode::hierarchical},
                                           Topology{8, 4, CrossNode::hierarchical},
                                           Topology{8, 2, CrossNode::hierarchical}
#endif
                                           ),
                         [](const auto& info) {
                           const Topology t = info.param;
                           if (t.per_node == 0) return "W" + std::to_string(t.ranks);
                           return "Nodes" + std::to_string(t.ranks / t.per_node) + "x" +
                                  std::to_string(t.per_node) +
                                  (t.cross_node == CrossNode::hierarchical ? "_hierarchical"
                                                                           : "");
                         });

// Placements and masked ranks with the ranks sharing a GPU: the kernels route indices to live
// slots from the table in device memory and wait for live ranks only (the CPU's cases, the same
// reference).
void expect_mask_case_on_gpu(int W, const MaskCase& c) { expect_mask_case(W, c, Device::cuda(0)); }

MaskCase mask_case(int W) {
  MaskCase c;
  c.config = make_config(/*max_tokens=*/7, /*experts=*/4 * W, /*top_k=*/3, /*hidden=*/40);
  c.config.rank_mask = true;
  return c;
}

TEST(AllToAllCudaMask, ReplicasLoseNoTokenWhenARankStops) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  for (bool split : {false, true}) {
    MaskCase c = mask_case(4);
    c.config.placement = ExpertPlacement::round_robin(8, 16);
    c.stops = {{3, 2}};
    c.split_phases = split;
    expect_mask_case_on_gpu(4, c);
  }
}

TEST(AllToAllCudaMask, WithoutReplicasTheExpertsOfStoppedRanksAreDropped) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  for (MaskedExperts rule : {MaskedExperts::drop, MaskedExperts::renormalize}) {
    MaskCase c = mask_case(4);
    c.config.masked_experts = rule;
    c.calls = 6;
    c.stops = {{1, 1}, {2, 3}};
    expect_mask_case_on_gpu(4, c);
  }
}

// The graphs are captured before the mask; replays read it (and the routing table) from device
// memory, so the ranks that go on need no new capture.
TEST(AllToAllCudaMask, ACapturedGraphFollowsTheMask) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  for (bool replicas : {true, false}) {
    MaskCase c = mask_case(4);
    if (replicas) c.config.placement = ExpertPlacement::round_robin(8, 16);
    c.config.masked_experts = MaskedExperts::renormalize;
    c.calls = 6;
    c.stops = {{2, 2}, {1, 4}};
    c.graph = true;
    expect_mask_case_on_gpu(4, c);
  }
}

TEST(AllToAllCudaMask, ReplicasSpreadTokensWithoutAMask) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  MaskCase c = mask_case(2);
  c.config.rank_mask = false;
  c.config.placement = ExpertPlacement::round_robin(4, 8);
  expect_mask_case_on_gpu(2, c);
}

}  // namespace
}  // namespace pmoe::testing
