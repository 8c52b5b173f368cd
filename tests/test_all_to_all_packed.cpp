// Packed expert rows of exactly the size that arrives: dispatch(send), arriving_rows(), an
// [n, H] expert_x, dispatch(recv), then combine from an [n, H] expert_y, against the reference,
// and the misuses refused by name, the op usable after each.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "all_to_all_cases.hpp"
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

// The expected rows of every local expert, back to back.
std::vector<std::byte> packed_expected(const reference::DispatchExpected& expected) {
  std::vector<std::byte> all;
  for (const auto& rows : expected.rows) all.insert(all.end(), rows.begin(), rows.end());
  return all;
}

// Message of the pmoe::Error `call` throws, or "" if it throws none.
std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// One rank's round with exactly sized rows; returns what differs from the reference, or "".
// too_small: first offer dispatch(recv) one row too few, and combine one too few (both
// refused, by name), then the right sizes.
std::string exact_round(Communicator& comm, AllToAll& a2a, const AllToAllConfig& cfg, int call,
                        bool too_small) {
  const int W = comm.size(), rank = comm.rank(), H = cfg.hidden_dim;
  const int E_local = cfg.num_experts / W;
  std::vector<reference::AllToAllInputs> all;
  for (int r = 0; r < W; ++r)
    all.push_back(reference::make_inputs(cfg, r, (call + r) % 4 == 3 ? 0 : 7 - r % 3,
                                         reference::hash64(call, 3), Routing::dropped));
  const auto& mine = all[size_t(rank)];
  Buffer counts(DType::i32, {E_local});
  Buffer none(cfg.in_dtype, {0, H});  // dispatch(send) writes no row
  a2a.dispatch(mine.x, Tensor(), mine.indices, counts, none, Tensor(), Phase::send);
  const int64_t n = a2a.arriving_rows();
  const auto expected = reference::reference_dispatch(cfg, W, rank, all);
  int64_t want_n = 0;
  for (int32_t c : expected.counts) want_n += c;
  if (n != want_n) return detail::cat("arriving_rows() = ", n, ", expected ", want_n);

  if (too_small && n > 0) {
    Buffer short_rows(cfg.in_dtype, {n - 1, H});
    const std::string error = error_of([&] {
      a2a.dispatch(mine.x, Tensor(), mine.indices, counts, short_rows, Tensor(), Phase::recv);
    });
    if (error.find("packed `expert_x` has " + std::to_string(n - 1) + " rows, fewer than the "
                   "rows arriving this call") == std::string::npos)
      return "short expert_x: " + error;
  }
  Buffer rows(cfg.in_dtype, {n, H});
  a2a.dispatch(mine.x, Tensor(), mine.indices, counts, rows, Tensor(), Phase::recv);
  if (std::memcmp(counts.data<int32_t>(), expected.counts.data(), expected.counts.size() * 4) != 0)
    return "expert_num_tokens differs from the reference";
  const std::vector<std::byte> want = packed_expected(expected);
  if (size_t(rows.nbytes()) != want.size() ||
      (!want.empty() && std::memcmp(rows.data<void>(), want.data(), want.size()) != 0))
    return "packed rows differ from the reference";

  Buffer expert_y(DType::f32, {n, H});
  reference::run_fake_experts(cfg, W, rank, counts, rows, Tensor(), expert_y);
  Buffer y(cfg.out_dtype, {mine.m, H});
  if (too_small && n > 0) {
    Buffer short_y(DType::f32, {n - 1, H});
    const std::string error =
        error_of([&] { a2a.combine(short_y, mine.indices, mine.weights, y); });
    if (error.find("fewer than the rows the matching dispatch received") == std::string::npos)
      return "short expert_y: " + error;
  }
  a2a.combine(expert_y, mine.indices, mine.weights, y);
  return reference::compare_bytes("combine y", y, reference::reference_combine(cfg, mine,
                                                                                DType::f32));
}

void expect_exact_rounds(int W, int per_node, bool too_small) {
  std::vector<std::string> errors(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) {
    AllToAllConfig cfg = packed_config(W);
    cfg.ranks_per_node = per_node;
    AllToAll a2a(comm, cfg);
    for (int call = 0; call < 6 && errors[size_t(comm.rank())].empty(); ++call)
      errors[size_t(comm.rank())] = exact_round(comm, a2a, cfg, call, too_small);
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
