// AllToAll with on_peer_loss = mask on a device: ranks sharing a GPU stop without a word, the
// others' kernels end their waits (the peer timeout, or the abort word their host's watcher sets),
// the survivors agree on the mask and the first lost call, and every later call matches the
// reference with the mask it used (tests/all_to_all_mask_cases.hpp, the CPU's cases).
#include <gtest/gtest.h>

#include "all_to_all_cases.hpp"
#include "all_to_all_mask_cases.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "moe_cases.hpp"
#include "pmoe/all_to_all.hpp"

namespace pmoe::testing {
namespace {

// Kernels wait this long for a silent peer. Generous for 4 ranks' kernels emulated on 2 shared
// cores, where a live peer's block may wait its turn for a while.
constexpr double kPeerTimeout = 2.0;

MaskCase automatic(int W) {
  MaskCase c;
  c.config = make_config(/*max_tokens=*/7, /*experts=*/4 * W, /*top_k=*/3, /*hidden=*/40);
  return lost_rank_case(c, kPeerTimeout, 6);
}

void expect_on_device(int W, const MaskCase& c) { expect_mask_case(W, c, Device::cuda(0)); }

TEST(AllToAllCudaPeerLoss, NobodyLostRunsAsThePlainOp) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  expect_on_device(3, automatic(3));
}

// Where the rank stops decides which call the survivors lose: the one it never starts, the one
// whose combine waits for it, or (split phases) the next.
TEST(AllToAllCudaPeerLoss, ARankThatStopsIsFoundLostAndTheOthersGoOnWithItsReplicas) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  using StopPoint = MaskCase::StopPoint;
  for (StopPoint point : {StopPoint::before_call, StopPoint::after_dispatch_send,
                          StopPoint::after_combine_send}) {
    MaskCase c = automatic(4);
    c.config.placement = ExpertPlacement::round_robin(8, 16);  // no token lost with rank 2
    c.stops = {{2, 2}};
    c.stop_point = point;
    c.split_phases = point == StopPoint::after_combine_send;
    SCOPED_TRACE(int(point));
    expect_on_device(4, c);
  }
}

TEST(AllToAllCudaPeerLoss, TwoRanksLostOneAfterTheOther) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  MaskCase c = automatic(4);
  c.config.masked_experts = MaskedExperts::renormalize;
  c.calls = 7;
  c.stops = {{3, 1}, {0, 4}};
  expect_on_device(4, c);
}

// Graphs captured before any loss replay after it: the epoch, the mask and the slot table they
// read are in device memory, which the restart rewrote.
TEST(AllToAllCudaPeerLoss, CapturedGraphsGoOnAfterTheLoss) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  MaskCase c = automatic(3);
  c.config.placement = ExpertPlacement::round_robin(6, 12);
  c.stops = {{1, 2}};
  c.graph = true;
  expect_on_device(3, c);
}

TEST(AllToAllCudaPeerLoss, ARankTheOthersWentOnWithoutCannotCallAgain) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  MaskCase c = automatic(3);
  c.stops = {{1, 2}};
  c.stopped_rank_returns = true;
  expect_on_device(3, c);
}

TEST(AllToAllCudaPeerLoss, ARankThatWasLostRejoinsAndTheGroupIsWholeAgain) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  MaskCase c = automatic(3);
  c.config.placement = ExpertPlacement::round_robin(6, 12);
  c.calls = 7;
  c.stops = {{2, 2}};
  c.rejoins = {{2, 5}};
  expect_on_device(3, c);
}

// EpMoe on ranks sharing the GPU: a rank lost and taken back (moe_cases.hpp), with one
// micro-batch and with two; a lost forward may be found by its check_errors().
class EpMoeCudaPeerLoss : public ::testing::TestWithParam<int> {};

TEST_P(EpMoeCudaPeerLoss, GoesOnWhenARankIsLostAndTakesItBack) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  expect_ep_moe_loses_a_rank_and_takes_it_back(Device::cuda(0), GetParam(), kPeerTimeout);
}

INSTANTIATE_TEST_SUITE_P(MicroBatches, EpMoeCudaPeerLoss, ::testing::Values(1, 2));

}  // namespace
}  // namespace pmoe::testing
