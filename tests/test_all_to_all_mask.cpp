// Expert placements and masked ranks on CPU thread ranks: replicas spread the load and keep
// every token when a rank stops; without a replica the expert's slots are dropped (or the rest
// renormalised); bad placements and masks are refused before anything moves. With
// on_peer_loss = mask the survivors find a stopped rank themselves, agree, and go on.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "all_to_all/loss_board.hpp"
#include "all_to_all_cases.hpp"
#include "all_to_all_mask_cases.hpp"
#include "pmoe/error.hpp"

namespace pmoe::testing {
namespace {

// W ranks, 4 slots a rank, top-3, max 7 tokens.
MaskCase base(int W) {
  MaskCase c;
  c.config = make_config(/*max_tokens=*/7, /*experts=*/4 * W, /*top_k=*/3, /*hidden=*/24);
  c.config.rank_mask = true;
  return c;
}

TEST(AllToAllMask, ReplicasSpreadTokensWithoutAMask) {
  for (int W : {2, 4}) {
    MaskCase c = base(W);
    c.config.rank_mask = false;
    c.config.placement = ExpertPlacement::round_robin(2 * W, 4 * W);  // two slots an expert
    expect_mask_case(W, c);
  }
}

TEST(AllToAllMask, ReplicasLoseNoTokenWhenARankStops) {
  for (int W : {2, 4}) {
    for (bool split : {false, true}) {
      MaskCase c = base(W);
      c.config.placement = ExpertPlacement::round_robin(2 * W, 4 * W);
      c.stops = {{W - 1, 2}};
      c.split_phases = split;
      expect_mask_case(W, c);
    }
  }
}

TEST(AllToAllMask, WithoutReplicasTheExpertsOfAStoppedRankAreDropped) {
  for (MaskedExperts rule : {MaskedExperts::drop, MaskedExperts::renormalize}) {
    MaskCase c = base(4);
    c.config.masked_experts = rule;
    c.stops = {{1, 1}};
    expect_mask_case(4, c);
  }
}

TEST(AllToAllMask, TwoRanksStopOneAfterTheOther) {
  MaskCase c = base(4);
  c.config.placement = ExpertPlacement::round_robin(8, 16);  // rank r+2 holds rank r's experts
  c.config.masked_experts = MaskedExperts::renormalize;
  c.calls = 6;
  c.stops = {{3, 1}, {1, 3}};  // after the second, experts 4 to 7 are gone
  expect_mask_case(4, c);
}

TEST(AllToAllMask, QueryNamesTheMaskedRanksAndTheLostExperts) {
  run_ranks(3, [](Communicator& comm) {
    AllToAllConfig cfg = make_config(4, 6, 2, 8);
    cfg.rank_mask = true;
    AllToAll a2a(comm, cfg);
    EXPECT_EQ(a2a.rank_mask().live_count(), 3);
    EXPECT_TRUE(a2a.lost_experts().empty());
    if (comm.rank() == 2) return;
    a2a.mask_rank(2, "drained");
    EXPECT_EQ(a2a.rank_mask().live, (std::vector<uint8_t>{1, 1, 0}));
    EXPECT_EQ(a2a.rank_mask().reasons[2], "drained");
    EXPECT_EQ(a2a.lost_experts(), (std::vector<int>{4, 5}));
  });
}

TEST(AllToAllMask, BadPlacementsAndMasksAreRefusedBeforeAnythingMoves) {
  AllToAllConfig cfg = make_config(4, 4, 2, 8);
  cfg.placement.num_logical_experts = 3;
  cfg.placement.slot_expert = {0, 1, 0, 1};  // expert 2 has no slot
  EXPECT_THROW(cfg.validate(2), Error);
  try {
    cfg.validate(2);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("logical expert 2 has no slot"), std::string::npos)
        << e.what();
  }
  cfg.placement.slot_expert = {0, 1, 2};  // one slot short
  EXPECT_THROW(cfg.validate(2), Error);
  cfg.placement = {};
  cfg.rank_mask = true;
  cfg.ranks_per_node = 1;
  EXPECT_THROW(cfg.validate(2), Error);

  run_ranks(2, [](Communicator& comm) {
    AllToAllConfig plain = make_config(4, 4, 2, 8);
    AllToAll unmaskable(comm, plain);
    EXPECT_THROW(unmaskable.mask_rank(1 - comm.rank(), ""), Error);  // rank_mask not set
    plain.rank_mask = true;
    AllToAll a2a(comm, plain);
    EXPECT_THROW(a2a.mask_rank(comm.rank(), ""), Error);  // itself: the last live rank
    EXPECT_THROW(a2a.mask_rank(2, ""), Error);
    EXPECT_THROW(a2a.mask_rank(-1, ""), Error);
    EXPECT_EQ(a2a.rank_mask().live_count(), 2);  // nothing changed
    // An index past the logical experts is refused with the placement's bound.
    AllToAllConfig placed = make_config(4, 4, 2, 8);
    placed.placement = ExpertPlacement::round_robin(2, 4);
    AllToAll p(comm, placed);
    Buffer x(DType::bf16, {1, 8}), idx(DType::i32, {1, 2}), counts(DType::i32, {2}),
        ex(DType::bf16, {2, 8, 8});
    idx.data<int32_t>()[0] = 0;
    idx.data<int32_t>()[1] = 3;  // a slot, not a logical expert
    EXPECT_THROW(p.dispatch(x, Tensor(), idx, counts, ex, Tensor()), Error);
  });
}

// on_peer_loss = mask: ranks stop without a word, and the others find them lost after the peer
// timeout. Generous for 4 thread ranks on 2 shared cores, where a live rank may wait its turn.
constexpr double kPeerTimeout = 1.0;

MaskCase automatic(int W) { return lost_rank_case(base(W), kPeerTimeout, 7); }

TEST(AllToAllPeerLoss, NobodyLostRunsAsThePlainOp) {
  for (int W : {2, 4}) expect_mask_case(W, automatic(W));
}

TEST(AllToAllPeerLoss, ARankThatStopsIsFoundLostAndTheOthersGoOnWithItsReplicas) {
  using StopPoint = MaskCase::StopPoint;
  for (StopPoint point : {StopPoint::before_call, StopPoint::after_dispatch_send,
                          StopPoint::after_combine_send}) {
    MaskCase c = automatic(4);
    c.config.placement = ExpertPlacement::round_robin(8, 16);  // no token lost with rank 2
    c.stops = {{2, 2}};
    c.stop_point = point;
    c.split_phases = point == StopPoint::after_combine_send;
    SCOPED_TRACE(int(point));
    expect_mask_case(4, c);
  }
}

TEST(AllToAllPeerLoss, TwoRanksLostOneAfterTheOther) {
  MaskCase c = automatic(4);
  c.config.masked_experts = MaskedExperts::renormalize;
  c.calls = 8;
  c.stops = {{3, 1}, {0, 4}};
  expect_mask_case(4, c);
}

TEST(AllToAllPeerLoss, ARankTheOthersWentOnWithoutCannotCallAgain) {
  MaskCase c = automatic(3);
  c.stops = {{1, 2}};
  c.stopped_rank_returns = true;
  expect_mask_case(3, c);
}

// A rank found lost comes back: the others unmask it, it rejoins, and from then on every call is
// the full group's again; once after a clean stop, once after its own call failed because the
// others had gone on without it.
TEST(AllToAllPeerLoss, ARankThatWasLostRejoinsAndTheGroupIsWholeAgain) {
  for (bool refused_first : {false, true}) {
    MaskCase c = automatic(4);
    c.config.placement = ExpertPlacement::round_robin(8, 16);
    c.calls = 8;
    c.stops = {{3, 2}};
    c.rejoins = {{3, 5}};
    c.stopped_rank_returns = refused_first;
    SCOPED_TRACE(refused_first);
    expect_mask_case(4, c);
  }
}

TEST(AllToAllPeerLoss, UnmaskRejoinAndGoOnWithoutRefuseWhatTheyCannotDo) {
  run_ranks(2, [](Communicator& comm) {
    AllToAllConfig cfg = make_config(4, 4, 2, 8);
    cfg.rank_mask = true;
    AllToAll manual(comm, cfg);
    EXPECT_THROW(manual.unmask_rank(1 - comm.rank()), Error);  // no board: on_peer_loss fail
    EXPECT_THROW(manual.rejoin(), Error);
    cfg.on_peer_loss = OnPeerLoss::mask;
    cfg.peer_timeout_s = 0.2;
    AllToAll a2a(comm, cfg);
    EXPECT_THROW(a2a.unmask_rank(1 - comm.rank()), Error);  // live
    EXPECT_THROW(a2a.unmask_rank(5), Error);
    EXPECT_THROW(manual.go_on_without({1 - comm.rank()}), Error);  // no board
    EXPECT_THROW(a2a.go_on_without({comm.rank()}), Error);
    EXPECT_THROW(a2a.go_on_without({5}), Error);
    a2a.go_on_without({});  // nobody new: returns at once
    EXPECT_EQ(a2a.rank_mask().live, (std::vector<uint8_t>{1, 1}));
    comm.barrier();
  });
}

// The agreement itself, with the calls a lost peer can leave the survivors in: rank 0 finished
// call 5 (the dead rank had sent it everything) and began 6; ranks 1 and 2 are still in 5. All
// three must agree that 5 is the first lost call and that the next is 7.
TEST(AllToAllPeerLoss, TheAgreementTakesTheFirstUnfinishedCallAndTheMostBegun) {
  run_ranks(4, [](Communicator& comm) {
    detail::LossBoard board(comm, kPeerTimeout);
    comm.barrier();
    if (comm.rank() == 3) return;  // lost
    const std::vector<uint8_t> live(4, 1);
    detail::PeerLossNoticed noticed{{3}, {"its process ended"}};
    const int64_t done = comm.rank() == 0 ? 5 : 4;
    const auto out = board.agree(live, noticed, done, done + 1);
    EXPECT_FALSE(out.excluded);
    EXPECT_EQ(out.lost, std::vector<int>{3});
    EXPECT_EQ(out.first_lost_call, 5);
    EXPECT_EQ(out.calls_base, 6);
  });
}

// Survivors that suspect different ranks merge what they read: ranks 0 and 1 find 3 lost, rank
// 1 also finds rank 2 silent; rank 2, alive, reads that it is held lost and must not go on.
TEST(AllToAllPeerLoss, SuspicionsMergeAndARankHeldLostIsExcluded) {
  run_ranks(4, [](Communicator& comm) {
    detail::LossBoard board(comm, kPeerTimeout);
    comm.barrier();
    const int rank = comm.rank();
    if (rank == 3) return;
    const std::vector<uint8_t> live(4, 1);
    detail::PeerLossNoticed noticed{{3}, {"its process ended"}};
    if (rank == 1) noticed = {{2, 3}, {"awaited for too long", "its process ended"}};
    if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // 1 posts first
    const auto out = board.agree(live, noticed, 2, 3);
    if (rank == 2) {
      EXPECT_TRUE(out.excluded);
      EXPECT_NE(out.excluded_why.find("holds this rank lost"), std::string::npos)
          << out.excluded_why;
      return;
    }
    EXPECT_FALSE(out.excluded);
    EXPECT_EQ(out.lost, (std::vector<int>{2, 3}));
    EXPECT_EQ(out.first_lost_call, 3);
  });
}

TEST(AllToAllPeerLoss, BadPoliciesAreRefused) {
  AllToAllConfig cfg = make_config(4, 4, 2, 8);
  cfg.on_peer_loss = OnPeerLoss(7);
  EXPECT_THROW(cfg.validate(2), Error);
  cfg.on_peer_loss = OnPeerLoss::mask;
  cfg.peer_timeout_s = -1;
  EXPECT_THROW(cfg.validate(2), Error);
  cfg.peer_timeout_s = 1;
  cfg.ranks_per_node = 1;  // a node split: peers not load/store reachable
  EXPECT_THROW(cfg.validate(2), Error);
  cfg.ranks_per_node = 0;
  EXPECT_NO_THROW(cfg.validate(2));
}

}  // namespace
}  // namespace pmoe::testing
