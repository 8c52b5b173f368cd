// AllToAll with thread ranks, W in {1, 2, 3, 4, 8} on one node and as nodes x ranks 2x2, 2x4, 4x2
// (off-node peers through put/signal only), against the plain reference.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "all_to_all_cases.hpp"
#include "pmoe/comm.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {
namespace {

using reference::Routing;

// Runs `c` on W thread ranks; every rank must match the reference. Returns the rank-0 digest.
uint64_t expect_case(int W, const AllToAllCase& c) {
  std::vector<CaseResult> results(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) { results[size_t(comm.rank())] = run_all_to_all_case(comm, c); });
  uint64_t remote = 0;
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(results[size_t(r)].error, "") << "W = " << W;
    remote += results[size_t(r)].remote_bytes;
  }
  // A split world reaches its off-node peers through put only (a case that sends nothing at all
  // is the exception: none here).
  const int per_node = c.config.ranks_per_node;
  if (per_node > 0 && per_node < W) {
    EXPECT_GT(remote, 0u) << "nothing went to another node";
  }
  return results[0].digest;
}

// Ranks, and ranks per node (0: one node).
struct Topology {
  int ranks, per_node;
};

class AllToAllThreads : public ::testing::TestWithParam<Topology> {
 protected:
  int W() const { return GetParam().ranks; }
  // Two experts per rank unless a test asks otherwise.
  AllToAllCase base(int top_k = 3, int hidden = 40) const {
    AllToAllCase c;
    c.config = make_config(/*max_tokens=*/9, /*experts=*/2 * W(), std::min(top_k, 2 * W()), hidden);
    c.calls = 3;
    c.config.ranks_per_node = GetParam().per_node;
    return c;
  }
};

TEST_P(AllToAllThreads, RandomRoutingBf16) { expect_case(W(), base()); }

TEST_P(AllToAllThreads, EveryPayloadAndOutputDtype) {
  for (DType in : {DType::f32, DType::bf16, DType::f16}) {
    for (DType out : {DType::f32, DType::bf16, DType::f16}) {
      AllToAllCase c = base();
      c.config.in_dtype = in;
      c.config.out_dtype = out;
      c.expert_y_dtype = in;
      expect_case(W(), c);
    }
  }
}

TEST_P(AllToAllThreads, F8WithBlockScales) {
  for (DType expert_y : {DType::f32, DType::bf16, DType::f16}) {
    AllToAllCase c = base(3, 64);
    c.config.in_dtype = DType::f8e4m3;
    c.config.scale_block = 16;
    c.expert_y_dtype = expert_y;
    expect_case(W(), c);
  }
}

TEST_P(AllToAllThreads, OddHiddenSizes) {
  for (int hidden : {1, 7, 33}) {
    AllToAllCase c = base(2, hidden);
    c.config.in_dtype = DType::f16;
    expect_case(W(), c);
  }
}

TEST_P(AllToAllThreads, NoTokensOnSomeRanks) {
  AllToAllCase c = base();
  c.tokens = TokenCounts::zero_on_odd;
  expect_case(W(), c);
}

TEST_P(AllToAllThreads, EveryTokenToOneExpert) {
  AllToAllCase c = base();
  c.routing = Routing::hot_expert;
  c.tokens = TokenCounts::full;  // expert 0 receives W * max_tokens rows: its whole capacity
  expect_case(W(), c);
}

TEST_P(AllToAllThreads, DroppedSlots) {
  AllToAllCase c = base();
  c.routing = Routing::dropped;
  c.calls = 5;
  expect_case(W(), c);
}

TEST_P(AllToAllThreads, TopKEqualsNumExperts) {
  AllToAllCase c = base();
  c.config.top_k = c.config.num_experts;
  expect_case(W(), c);
}

TEST_P(AllToAllThreads, SeveralExpertsPerRank) {
  AllToAllCase c = base();
  c.config.num_experts = 5 * W();
  c.config.top_k = 4;
  expect_case(W(), c);
}

TEST_P(AllToAllThreads, SplitPhasesWithWorkAndBarrierBetween) {
  AllToAllCase c = base();
  c.split_phases = true;
  expect_case(W(), c);
}

TEST_P(AllToAllThreads, BitIdenticalAcrossRuns) {
  AllToAllCase c = base();
  c.calls = 4;
  const uint64_t first = expect_case(W(), c);
  const uint64_t second = expect_case(W(), c);
  EXPECT_EQ(first, second);
}

// torch.topk returns int64 indices: the op takes them as they are, with the same results.
TEST_P(AllToAllThreads, Int64IndicesGiveTheSameBits) {
  AllToAllCase c = base();
  c.routing = reference::Routing::dropped;
  const uint64_t narrow = expect_case(W(), c);
  c.i64_indices = true;
  EXPECT_EQ(expect_case(W(), c), narrow);
}

TEST_P(AllToAllThreads, InPlaceBuffers) {
  for (DType in : {DType::bf16, DType::f8e4m3}) {
    AllToAllCase c = base(3, 64);
    c.config.in_dtype = in;
    c.config.scale_block = in == DType::f8e4m3 ? 16 : 0;
    c.config.in_place_buffers = true;
    c.in_place = true;
    c.routing = Routing::dropped;
    c.tokens = TokenCounts::zero_on_odd;
    expect_case(W(), c);
  }
}

TEST_P(AllToAllThreads, InPlaceBuffersWithSplitPhases) {
  AllToAllCase c = base();
  c.config.in_place_buffers = true;
  c.in_place = true;
  c.split_phases = true;
  c.calls = 20;
  expect_case(W(), c);
}

TEST_P(AllToAllThreads, InPlaceConfigWithCallerBuffers) {
  AllToAllCase c = base();
  c.config.in_place_buffers = true;  // allocated but not used: the copy path still works
  c.expert_y_dtype = DType::f32;
  expect_case(W(), c);
}

// Packed rows: the experts' rows back to back from flat row 0, the rest of the buffer untouched;
// combine reads them there (from caller buffers, and in place from the op's own).
TEST_P(AllToAllThreads, PackedExpertRows) {
  for (const bool in_place : {false, true}) {
    for (DType in : {DType::f32, DType::f8e4m3}) {
      AllToAllCase c = base(3, 48);
      c.config.in_dtype = in;
      c.config.scale_block = in == DType::f8e4m3 ? 16 : 0;
      c.config.packed_expert_rows = true;
      c.config.in_place_buffers = in_place;
      c.in_place = in_place;
      c.routing = Routing::dropped;
      c.tokens = in_place ? TokenCounts::zero_on_odd : TokenCounts::random;
      c.split_phases = in_place;
      expect_case(W(), c);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAllThreads,
                         ::testing::Values(Topology{1, 0}, Topology{2, 0}, Topology{3, 0},
                                           Topology{4, 0}, Topology{8, 0}, Topology{4, 2},
                                           Topology{8, 4}, Topology{8, 2}),
                         [](const auto& info) {
                           const Topology t = info.param;
                           if (t.per_node == 0) return "W" + std::to_string(t.ranks);
                           return "Nodes" + std::to_string(t.ranks / t.per_node) + "x" +
                                  std::to_string(t.per_node);
                         });

TEST(AllToAllThreads, ThousandCallsOnTheSameBuffers) {
  AllToAllCase c;
  c.config = make_config(/*max_tokens=*/6, /*experts=*/8, /*top_k=*/3, /*hidden=*/16);
  c.routing = Routing::dropped;
  c.calls = 1000;  // routing and m change every call; buffers and signals are reused
  expect_case(4, c);
}

TEST(AllToAllThreads, ThousandInPlaceCalls) {
  AllToAllCase c;
  c.config = make_config(6, 8, 3, 16);
  c.config.in_place_buffers = true;
  c.in_place = true;
  c.calls = 1000;  // a peer reading stale in-place data would show as a mismatch
  expect_case(4, c);
}

TEST(AllToAllThreads, ThousandPackedInPlaceCalls) {
  AllToAllCase c;
  c.config = make_config(6, 8, 3, 16);
  c.config.in_place_buffers = c.config.packed_expert_rows = true;
  c.in_place = true;
  c.calls = 1000;  // the counts, and so every expert's first row, change every call
  expect_case(4, c);
}

// Packing is a rank's own layout: its peers' senders and combines do not depend on it.
TEST(AllToAllThreads, RanksMayDifferInPacking) {
  for (int packed_rank = 0; packed_rank < 3; ++packed_rank) {
    std::vector<std::string> errors(3);
    run_ranks(3, [&](Communicator& comm) {
      AllToAllCase c;
      c.config = make_config(7, 6, 2, 24);
      c.config.packed_expert_rows = comm.rank() == packed_rank;
      c.calls = 4;
      errors[size_t(comm.rank())] = run_all_to_all_case(comm, c).error;
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "") << "packed rank " << packed_rank;
  }
}

TEST(AllToAllThreads, ThousandSplitCallsOnTheSameBuffers) {
  AllToAllCase c;
  c.config = make_config(6, 8, 2, 16, DType::f8e4m3, DType::bf16, 8);
  c.split_phases = true;
  c.calls = 1000;
  expect_case(4, c);
}

}  // namespace
}  // namespace pmoe::testing

namespace pmoe::testing {
namespace {

// bound_m on the CPU: x holds max_tokens rows, but only the first bound_m take part; the
// result is the one of a call with just those rows (the inputs' first rows do not depend on m).
TEST(AllToAllThreads, BoundMUsesTheFirstRowsOnly) {
  const AllToAllConfig cfg = make_config(8, 4, 2, 32);
  std::vector<std::string> errors(2);
  run_ranks(2, [&](Communicator& comm) {
    const int rank = comm.rank(), m = 3 + rank, L = 2;
    AllToAll a2a(comm, cfg);
    const auto full = reference::make_inputs(cfg, rank, 8, 11, reference::Routing::random);
    std::vector<reference::AllToAllInputs> used;
    for (int r = 0; r < 2; ++r) used.push_back(reference::make_inputs(cfg, r, 3 + r, 11, reference::Routing::random));
    Buffer bound(DType::i32, {1}), counts(DType::i32, {L}), expert_x(DType::bf16, {L, 16, 32}),
        expert_y(DType::bf16, {L, 16, 32}), y(DType::bf16, {8, 32});
    *bound.data<int32_t>() = m;
    std::memset(expert_x.data<void>(), 0xA5, expert_x.nbytes());
    a2a.dispatch(full.x, Tensor(), full.indices, counts, expert_x, Tensor(), Phase::both, bound);
    std::string error = reference::compare_dispatch(
        cfg, 2, reference::reference_dispatch(cfg, 2, rank, used), counts, expert_x, Tensor(), 0xA5);
    reference::run_fake_experts(cfg, 2, rank, counts, expert_x, Tensor(), expert_y);
    a2a.combine(expert_y, full.indices, full.weights, y, Phase::both, bound);
    const Tensor first_rows(y.data<void>(), DType::bf16, {m, 32});
    if (error.empty())
      error = reference::compare_bytes("y", first_rows,
                                       reference::reference_combine(cfg, used[size_t(rank)], DType::bf16));
    errors[size_t(rank)] = error;
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
}  // namespace pmoe::testing
