// Bad input to AllGatherGemm and GemmReduceScatter: one test per rejected case, asserting the
// message. Every rank gets the same bad input, so every rank rejects it before anything moves;
// then a correct call must still match the reference.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "cpu/gemm.hpp"
#include "overlap_cases.hpp"
#include "pmoe/error.hpp"
#include "reference/overlap_reference.hpp"

namespace pmoe::testing {
namespace {

const OverlapConfig kGood = make_overlap_config(60, 84, 108, DType::bf16, 4);

// Asserts that fn throws pmoe::Error whose message contains `needle`.
void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "accepted; expected an error containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Building the op on W ranks with `cfg` throws `needle` on every rank.
template <typename Op>
void expect_config_rejected(const OverlapConfig& cfg, const std::string& needle, int W = 2) {
  run_ranks(W, [&](Communicator& comm) { expect_error([&] { Op op(comm, cfg); }, needle); });
}

// The tensors of one rank for kGood, which a test may replace with bad views.
struct Args {
  Args(bool gather, int W, int rank)
      : in(gather ? reference::make_all_gather_gemm_inputs(kGood, W, rank, 7)
                  : reference::make_gemm_reduce_scatter_inputs(kGood, W, rank, 7)),
        C(gather ? Buffer(kGood.dtype, {kGood.m, kGood.n / W})
                 : Buffer(kGood.dtype, {kGood.m / W, kGood.n})),
        a(in.A),
        b(in.B),
        c(C) {}
  reference::OverlapInputs in;
  Buffer C;
  Tensor a, b, c;
};

// On 2 ranks: `bad` (given the op and valid args to spoil) must throw `needle` on every rank;
// then run() with the valid tensors must match the reference.
template <typename Op>
void expect_call_rejected(const std::string& needle, const std::function<void(Op&, Args&)>& bad) {
  constexpr bool gather = std::is_same_v<Op, AllGatherGemm>;
  const int W = 2;
  cpu::set_blas_threads(1);
  run_ranks(W, [&](Communicator& comm) {
    Op op(comm, kGood);
    Args args(gather, W, comm.rank());
    expect_error([&] { bad(op, args); }, needle);
    Args good(gather, W, comm.rank());
    op.run(good.a, good.b, good.c);
    std::vector<Tensor> a_parts, b_parts;
    std::vector<reference::OverlapInputs> all;
    for (int r = 0; r < W; ++r)
      all.push_back(gather ? reference::make_all_gather_gemm_inputs(kGood, W, r, 7)
                           : reference::make_gemm_reduce_scatter_inputs(kGood, W, r, 7));
    for (const auto& in : all) {
      a_parts.push_back(in.A);
      b_parts.push_back(in.B);
    }
    const auto want = gather ? reference::all_gather_gemm_reference(a_parts, good.in.B, kGood.dtype)
                             : reference::gemm_reduce_scatter_reference(a_parts, b_parts,
                                                                        comm.rank(), kGood.dtype);
    EXPECT_EQ(reference::compare_close("C after the rejection", good.C, want), "");
  });
}

// --- configs ---------------------------------------------------------------------------------

TEST(OverlapErrors, AllGatherGemmRejectsMNotDivisibleByW) {
  expect_config_rejected<AllGatherGemm>(
      make_overlap_config(61, 84, 108, DType::bf16),
      "AllGatherGemm: M (61) must be divisible by the world size (2): every rank holds M/W rows");
}

TEST(OverlapErrors, GemmReduceScatterRejectsMNotDivisibleByW) {
  expect_config_rejected<GemmReduceScatter>(
      make_overlap_config(60, 84, 108, DType::bf16),
      "GemmReduceScatter: M (60) must be "
      "divisible by the world size (7): every rank receives M/W rows",
      7);
}

TEST(OverlapErrors, AllGatherGemmRejectsNNotDivisibleByW) {
  expect_config_rejected<AllGatherGemm>(
      make_overlap_config(60, 85, 108, DType::bf16),
      "AllGatherGemm: N (85) must be divisible by the world size (2): every rank holds N/W "
      "columns of B");
}

TEST(OverlapErrors, GemmReduceScatterRejectsKNotDivisibleByW) {
  expect_config_rejected<GemmReduceScatter>(
      make_overlap_config(60, 84, 107, DType::bf16),
      "GemmReduceScatter: K (107) must be divisible by the world size (2): every rank holds K/W "
      "columns of A and K/W rows of B");
}

TEST(OverlapErrors, RejectsEmptySizes) {
  expect_config_rejected<AllGatherGemm>(make_overlap_config(60, 0, 108, DType::bf16),
                                        "AllGatherGemm: M, N and K must be >= 1, got M = 60, "
                                        "N = 0, K = 108");
}

TEST(OverlapErrors, RejectsSizesBeyondBlasInt) {
  expect_config_rejected<GemmReduceScatter>(
      make_overlap_config(60, 84, int64_t(1) << 32, DType::bf16),
      "GemmReduceScatter: M, N and K must be at most 2^31 - 1 (BLAS takes int sizes)");
}

TEST(OverlapErrors, RejectsDtypesOtherThanF32Bf16AndF16) {
  expect_config_rejected<AllGatherGemm>(
      make_overlap_config(60, 84, 108, DType::f8e4m3),
      "AllGatherGemm: dtype must be f32, bf16 or f16, got f8e4m3");
}

TEST(OverlapErrors, RejectsChunksThatAreNotAMultipleOfW) {
  expect_config_rejected<AllGatherGemm>(
      make_overlap_config(60, 84, 108, DType::bf16, 3),
      "AllGatherGemm: chunks (3) must be a multiple of the world size (2): each rank's block of "
      "M/W rows is cut into chunks/W pieces");
}

TEST(OverlapErrors, RejectsNegativeChunks) {
  expect_config_rejected<GemmReduceScatter>(
      make_overlap_config(60, 84, 108, DType::bf16, -2),
      "GemmReduceScatter: chunks must be >= 0 (0 means one per rank), got -2");
}

TEST(OverlapErrors, AllGatherGemmRejectsMoreChunksThanRows) {
  expect_config_rejected<AllGatherGemm>(
      make_overlap_config(60, 84, 108, DType::bf16, 62),
      "AllGatherGemm: chunks (62) exceeds M (60): every piece needs at least one row");
}

TEST(OverlapErrors, GemmReduceScatterRejectsMorePiecesThanColumns) {
  expect_config_rejected<GemmReduceScatter>(
      make_overlap_config(60, 84, 108, DType::bf16, 170),
      "GemmReduceScatter: chunks / W (85) exceeds N (84): every piece of a block needs at least "
      "one column");
}

TEST(OverlapErrors, RejectsNegativeMinOverlapBytes) {
  OverlapConfig cfg = kGood;
  cfg.min_overlap_bytes = -1;
  expect_config_rejected<AllGatherGemm>(cfg,
                                        "AllGatherGemm: min_overlap_bytes must be >= 0, got -1");
}

TEST(OverlapErrors, RejectsConfigsThatDifferBetweenRanks) {
  std::mutex mutex;
  std::vector<std::string> errors(2);
  run_ranks(2, [&](Communicator& comm) {
    OverlapConfig cfg = kGood;
    if (comm.rank() == 1) cfg.k = 216;
    try {
      AllGatherGemm op(comm, cfg);
    } catch (const Error& e) {
      std::lock_guard lock(mutex);
      errors[size_t(comm.rank())] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("AllGatherGemm on rank 0: the ranks' configs differ in K (108 on "
                           "rank 0; 216 on rank 1); every rank must build it with the same config"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("AllGatherGemm on rank 1: the ranks' configs differ in K"),
            std::string::npos)
      << errors[1];
}

TEST(OverlapErrors, RejectsADeviceOtherThanTheCommunicators) {
  run_ranks(1, [](Communicator& comm) {
    expect_error([&] { GemmReduceScatter op(comm, kGood, Device::cuda(0)); },
                 "GemmReduceScatter: device cuda:0 differs from the communicator's cpu");
  });
}

TEST(OverlapErrors, RejectsAnUnknownOrderName) {
  expect_error([] { parse_order("diagonal"); },
               "unknown overlap order 'diagonal'; expected ring or all-pairs");
}

// --- call arguments --------------------------------------------------------------------------

TEST(OverlapErrors, AllGatherGemmRejectsAWithMismatchedK) {
  Buffer wide(DType::bf16, {30, 109});
  expect_call_rejected<AllGatherGemm>(
      "AllGatherGemm::run: `A` must have shape [30, 108], got [30, 109]",
      [&](AllGatherGemm& op, Args& a) { op.run(wide, a.b, a.c); });
}

TEST(OverlapErrors, AllGatherGemmRejectsBWithMismatchedK) {
  Buffer short_b(DType::bf16, {100, 42});
  expect_call_rejected<AllGatherGemm>(
      "AllGatherGemm::run_serial: `B` must have shape [108, 42], got [100, 42]",
      [&](AllGatherGemm& op, Args& a) { op.run_serial(a.a, short_b, a.c); });
}

TEST(OverlapErrors, GemmReduceScatterRejectsCOfTheWrongShape) {
  Buffer full(DType::bf16, {60, 84});
  expect_call_rejected<GemmReduceScatter>(
      "GemmReduceScatter::run: `C` must have shape [30, 84], got [60, 84]",
      [&](GemmReduceScatter& op, Args& a) { op.run(a.a, a.b, full); });
}

TEST(OverlapErrors, GemmReduceScatterRejectsAWithMismatchedK) {
  Buffer a_wide(DType::bf16, {60, 108});
  expect_call_rejected<GemmReduceScatter>(
      "GemmReduceScatter::run_gemm_only: `A` must have shape [60, 54], got [60, 108]",
      [&](GemmReduceScatter& op, Args& a) { op.run_gemm_only(a_wide, a.b, a.c); });
}

TEST(OverlapErrors, RejectsTheWrongDtype) {
  Buffer a32(DType::f32, {30, 108});
  expect_call_rejected<AllGatherGemm>("AllGatherGemm::run: `A` must be bf16 (bfloat16), got f32 (float32)",
                                      [&](AllGatherGemm& op, Args& a) { op.run(a32, a.b, a.c); });
}

TEST(OverlapErrors, RejectsAMissingTensor) {
  expect_call_rejected<GemmReduceScatter>(
      "GemmReduceScatter::run: `C` is missing (expected bf16 [30, 84])",
      [&](GemmReduceScatter& op, Args& a) { op.run(a.a, a.b, Tensor()); });
}

TEST(OverlapErrors, RejectsAStridedView) {
  expect_call_rejected<AllGatherGemm>(
      "AllGatherGemm::run: `B` must be row-major contiguous", [&](AllGatherGemm& op, Args& a) {
        const int64_t shape[] = {108, 42}, strides[] = {1, 108};  // column-major
        op.run(a.a, Tensor(a.b.data(), DType::bf16, 2, shape, strides), a.c);
      });
}

TEST(OverlapErrors, RejectsATensorOnAnotherDevice) {
  expect_call_rejected<GemmReduceScatter>(
      "GemmReduceScatter::run_serial(communicate): `A` must be on cpu, got cuda:0",
      [&](GemmReduceScatter& op, Args& a) {
        op.run_serial(Tensor(a.a.data(), DType::bf16, {60, 54}, Device::cuda(0)), a.b, a.c,
                      SerialStep::communicate);
      });
}

// --- peers that never arrive -----------------------------------------------------------------

template <typename Op>
void expect_absent_rank_named(const char* op_name) {
  setenv("PMOE_TIMEOUT_S", "1", 1);
  const OverlapConfig cfg = make_overlap_config(60, 84, 108, DType::bf16, 6);
  constexpr bool gather = std::is_same_v<Op, AllGatherGemm>;
  std::mutex mutex;
  std::vector<std::string> errors(3), after(3);
  const auto start = std::chrono::steady_clock::now();
  run_ranks(3, [&](Communicator& comm) {
    Op op(comm, cfg);
    if (comm.rank() == 2) return;  // builds the op, never calls it
    const auto in = gather ? reference::make_all_gather_gemm_inputs(cfg, 3, comm.rank(), 1)
                           : reference::make_gemm_reduce_scatter_inputs(cfg, 3, comm.rank(), 1);
    Buffer C = gather ? Buffer(cfg.dtype, {60, 28}) : Buffer(cfg.dtype, {20, 84});
    std::string first, second;
    try {
      op.run(in.A, in.B, C);
    } catch (const Error& e) {
      first = e.what();
    }
    try {
      op.run(in.A, in.B, C);
    } catch (const Error& e) {
      second = e.what();
    }
    std::lock_guard lock(mutex);
    errors[size_t(comm.rank())] = first;
    after[size_t(comm.rank())] = second;
  });
  unsetenv("PMOE_TIMEOUT_S");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (int r : {0, 1}) {
    EXPECT_NE(errors[size_t(r)].find(std::string(op_name) + "::run on rank " + std::to_string(r) +
                                     ": rank 2 did not arrive within 1 s"),
              std::string::npos)
        << errors[size_t(r)];
    EXPECT_NE(after[size_t(r)].find(std::string("this ") + op_name + " is unusable"),
              std::string::npos)
        << after[size_t(r)];
  }
}

TEST(OverlapErrors, AllGatherGemmNamesARankThatNeverArrives) {
  expect_absent_rank_named<AllGatherGemm>("AllGatherGemm");
}

TEST(OverlapErrors, GemmReduceScatterNamesARankThatNeverArrives) {
  expect_absent_rank_named<GemmReduceScatter>("GemmReduceScatter");
}

}  // namespace
}  // namespace pmoe::testing
