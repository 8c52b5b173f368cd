// Packed expert rows of exactly the size that arrives (all_to_all_packed_cases.hpp) on thread
// ranks, and the misuses refused by name, the op usable after each.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "all_to_all_cases.hpp"
#include "all_to_all_packed_cases.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {
namespace {

using reference::Routing;

AllToAllConfig packed_config(int W) {
  AllToAllConfig c = make_config(/*max_tokens=*/7, /*experts=*/2 * W, std::min(3, 2 * W),
                                 /*hidden=*/20, DType::f32, DType::f32);
  c.packed_expert_rows = true;
  return c;
}

void expect_exact_rounds(int W, int per_node, bool too_small) {
  std::vector<std::string> errors(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) {
    AllToAllConfig cfg = packed_config(W);
    cfg.ranks_per_node = per_node;
    errors[size_t(comm.rank())] = run_exact_packed_rounds(comm, cfg, 6, too_small);
  });
  for (int r = 0; r < W; ++r) EXPECT_EQ(errors[size_t(r)], "") << "W = " << W << ", rank " << r;
}

TEST(AllToAllPacked, ExactlySizedRowsMatchTheReference) {
  for (int W : {1, 2, 3, 4}) expect_exact_rounds(W, 0, false);
}

TEST(AllToAllPacked, ExactlySizedRowsAcrossNodes) { expect_exact_rounds(4, 2, false); }

// Too few rows is refused before any row moves; the same call with enough then completes.
TEST(AllToAllPacked, TooFewRowsAreRefusedAndLoseNothing) { expect_exact_rounds(3, 0, true); }

TEST(AllToAllPacked, ArrivingRowsNeedsPackedRowsAndTheSendFirst) {
  run_ranks(2, [&](Communicator& comm) {
    AllToAllConfig padded = packed_config(2);
    padded.packed_expert_rows = false;
    AllToAll plain(comm, padded);
    EXPECT_NE(error_of([&] { plain.arriving_rows(); })
                  .find("set AllToAllConfig::packed_expert_rows"),
              std::string::npos);
    AllToAll packed(comm, packed_config(2));
    EXPECT_NE(error_of([&] { packed.arriving_rows(); })
                  .find("ask between dispatch(send) and dispatch(recv); the next step is "
                        "dispatch(send)"),
              std::string::npos);
  });
}

// Without arriving_rows(), a packed expert_x must hold the most that can arrive.
TEST(AllToAllPacked, UnaskedRecvNeedsRoomForTheMostThatCanArrive) {
  run_ranks(2, [&](Communicator& comm) {
    const AllToAllConfig cfg = packed_config(2);  // 2 ranks x 7 tokens x min(3, 2) rows
    AllToAll a2a(comm, cfg);
    const auto in = reference::make_inputs(cfg, comm.rank(), 7, 5, Routing::random);
    Buffer counts(DType::i32, {2}), rows(DType::f32, {27, 20}), enough(DType::f32, {28, 20});
    EXPECT_NE(error_of([&] {
                a2a.dispatch(in.x, Tensor(), in.indices, counts, rows, Tensor(), Phase::both);
              }).find("packed `expert_x` has 27 rows, fewer than the most that can arrive"),
              std::string::npos);
    a2a.dispatch(in.x, Tensor(), in.indices, counts, enough, Tensor(), Phase::both);
    Buffer y(DType::f32, {7, 20});
    a2a.combine(enough, in.indices, in.weights, y);
  });
}

}  // namespace
}  // namespace pmoe::testing
