// AllToAll with on_peer_loss = mask on a device: ranks sharing a GPU stop without a word, the
// others' kernels end their waits (the peer timeout, or the abort word their host's watcher sets),
// the survivors agree on the mask and the first lost call, and every later call matches the
// reference with the mask it used (tests/all_to_all_mask_cases.hpp, the CPU's cases).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "all_to_all_cases.hpp"
#include "all_to_all_mask_cases.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "moe_cases.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"
#include "pmoe/stream.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::testing {
namespace {

// Kernels wait this long for a silent peer. Generous for 4 ranks' kernels emulated on 2 shared
// cores, where a live peer's block may wait its turn for a while.
constexpr double kPeerTimeout = 2.0;

MaskCase automatic(int W) {
  MaskCase c;
  c.config = make_config(/*max_tokens=*/7, /*experts=*/4 * W, /*top_k=*/3, /*hidden=*/40);
  c.config.on_peer_loss = OnPeerLoss::mask;
  c.config.peer_timeout_s = kPeerTimeout;
  c.automatic = true;
  c.calls = 6;
  return c;
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

// One EpMoe forward of this rank's shard of a `batch`-token input from `seed`, on the device
// (through d_x and d_y, made once: freeing device memory waits for the whole device, where the
// peers' kernels may wait for this rank), checked (check_errors() after the stream) and compared
// with the reference: "" or what differs. PeerLost propagates, from the forward or the check.
std::string forward_shard_on_device(EpMoe& ep, Communicator& comm, int batch, uint64_t seed,
                                    const Buffer& d_x, const Buffer& d_y) {
  const MoeConfig& config = ep.config();
  const Buffer x = reference::make_moe_input(config, batch, seed);
  const RowRange mine = shard_rows(batch, comm.size(), comm.rank());
  const size_t row_bytes = size_t(config.feature_dim) * dtype_size(config.dtype);
  const Tensor x_mine(x.data<std::byte>() + size_t(mine.begin) * row_bytes, config.dtype,
                      {mine.size(), config.feature_dim});
  const Tensor x_on_device(d_x.data<void>(), config.dtype, {mine.size(), config.feature_dim},
                           comm.device()),
      y_on_device(d_y.data<void>(), config.dtype, {mine.size(), config.out_dim()}, comm.device());
  Buffer y(config.dtype, {mine.size(), config.out_dim()});
  copy(x_on_device, x_mine);
  ep.forward(x_on_device, y_on_device);
  synchronize(comm.stream());
  ep.check_errors();
  copy(y, y_on_device);
  std::vector<int> rows;
  for (int t = mine.begin; t < mine.end; ++t) rows.push_back(t);
  return reference::compare_moe(config, reference::reference_moe(config, x, rows), y, mine.begin,
                                reference::moe_tolerance(config.dtype))
      .error;
}

// EpMoe on ranks sharing the GPU, every expert on two ranks: rank 3 stops after two forwards,
// nobody masks it, and the others lose one forward (PeerLost, from that forward or its
// check_errors()) and then match the reference with its replicas; two forwards later they unmask
// it, it rejoins, and the layer is whole again. With one micro-batch and with two.
class EpMoeCudaPeerLoss : public ::testing::TestWithParam<int> {};

TEST_P(EpMoeCudaPeerLoss, GoesOnWhenARankIsLostAndTakesItBack) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const int W = 4;
  const MoeConfig config = make_moe_config(16, 24, 4, 2, Activation::gelu, DType::f32);
  EpMoeOptions options;
  options.micro_batches = GetParam();
  options.placement = ExpertPlacement::round_robin(4, 8);
  options.on_peer_loss = OnPeerLoss::mask;
  options.peer_timeout_s = kPeerTimeout;
  const int batch = 11;
  std::vector<std::string> errors(static_cast<size_t>(W));
  run_ranks(
      W,
      [&](Communicator& comm) {
        const int rank = comm.rank();
        const int most = shard_rows(batch, W, 0).size();
        EpMoe ep(comm, config, most, options);
        const Buffer d_x(config.dtype, {most, config.feature_dim}, comm.device()),
            d_y(config.dtype, {most, config.out_dim()}, comm.device());
        int lost = 0;
        for (int call = 0; call < 7; ++call) {
          if (call == 2 && rank == 3) {  // stops; comes back when the others unmask it
            ep.rejoin();
            call = 3;
            continue;
          }
          if (call == 4 && rank != 3) ep.unmask_rank(3);
          std::string error;
          try {
            error = forward_shard_on_device(ep, comm, batch, 60 + uint64_t(call), d_x, d_y);
          } catch (const PeerLost& e) {
            ++lost;
            if (e.ranks() != std::vector<int>{3} || e.first_call() != 3 || e.last_call() != 3)
              errors[size_t(rank)] = std::string("an unexpected PeerLost: ") + e.what();
            continue;
          }
          if (!error.empty() && errors[size_t(rank)].empty())
            errors[size_t(rank)] = "call " + std::to_string(call) + ": " + error;
        }
        EXPECT_EQ(lost, rank == 3 ? 0 : 1) << "rank " << rank;
        EXPECT_EQ(ep.rank_mask().live, (std::vector<uint8_t>{1, 1, 1, 1}));
      },
      Device::cuda(0));
  for (int r = 0; r < W; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(MicroBatches, EpMoeCudaPeerLoss, ::testing::Values(1, 2));

}  // namespace
}  // namespace pmoe::testing
