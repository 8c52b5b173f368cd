// AllGatherGemm and GemmReduceScatter with ranks as threads, against the plain references
// (all-gather then GEMM; GEMM then reduce-scatter), at W in {1, 2, 3, 4} (4 ranks outnumber the
// 2 cores of the test machine), with M, N, K that are not powers of two and chunks > W. The
// pipeline's plan (src/overlap/plan.hpp) is checked first, as pure logic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "cpu/gemm.hpp"
#include "overlap/plan.hpp"
#include "overlap_cases.hpp"
#include "reference/overlap_reference.hpp"

namespace pmoe::testing {
namespace {

using detail::ChunkLayout;

// --- the plan, without threads ---------------------------------------------------------------

TEST(OverlapPlan, PiecesTileEachBlockWithSizesWithinOneRow) {
  for (int W : {1, 2, 3, 4})
    for (int64_t block_rows : {1, 7, 15, 20})
      for (int P = 1; P <= block_rows; ++P) {
        const ChunkLayout layout(block_rows * W, W, P * W);
        int64_t next = 0, smallest = block_rows, largest = 0;
        for (int p = 0; p < P; ++p) {
          EXPECT_EQ(layout.piece_begin(p), next) << W << " " << block_rows << " " << P;
          next += layout.piece_rows(p);
          smallest = std::min(smallest, layout.piece_rows(p));
          largest = std::max(largest, layout.piece_rows(p));
        }
        EXPECT_EQ(next, block_rows);
        EXPECT_GE(smallest, 1);
        EXPECT_LE(largest - smallest, 1);
        EXPECT_EQ(layout.row(W - 1, 0), (W - 1) * block_rows);
      }
}

TEST(OverlapPlan, SignalsOfConsecutiveCallsNeverOverlap) {
  const ChunkLayout layout(60, 4, 12);  // 3 pieces per block
  EXPECT_EQ(layout.piece_signal(1, 0), 1u);
  EXPECT_EQ(layout.piece_signal(1, 2), layout.block_signal(1));
  EXPECT_EQ(layout.piece_signal(2, 0), layout.block_signal(1) + 1);
  EXPECT_EQ(layout.signal_slots(), 8);
  EXPECT_EQ(layout.ready_slot(3), 7);
}

TEST(OverlapPlan, AllGatherMultipliesOwnBlockFirstThenEveryOtherOnce) {
  for (int W : {1, 2, 3, 4}) {
    const ChunkLayout layout(12 * W, W, 2 * W);
    for (int r = 0; r < W; ++r) {
      const auto steps = detail::all_gather_steps(r, layout);
      ASSERT_EQ(steps.size(), size_t(2 * W));
      EXPECT_EQ(steps[0].block, r);
      EXPECT_EQ(steps[1].block, r);
      std::set<std::pair<int, int>> seen;
      for (const auto& s : steps) seen.insert({s.block, s.piece});
      EXPECT_EQ(seen.size(), steps.size());
    }
  }
}

// Every piece a rank waits for at step s is sent to it, exactly once, by the rank the order
// names; a relayed piece is one its sender received at an earlier step.
TEST(OverlapPlan, AllGatherSendsDeliverWhatEachStepAwaits) {
  for (bool ring : {false, true})
    for (int W : {1, 2, 3, 4}) {
      const ChunkLayout layout(6 * W, W, 3 * W);
      std::map<std::tuple<int, int, int>, int> delivered;  // (dest, block, piece) -> sender
      for (int r = 0; r < W; ++r) {
        const auto sends = detail::all_gather_sends(r, layout, ring);
        ASSERT_EQ(sends.size(), size_t((W - 1) * 3));
        for (size_t j = 0; j < sends.size(); ++j) {
          const auto& s = sends[j];
          EXPECT_TRUE(delivered.insert({{s.dest, s.block, s.piece}, r}).second);
          EXPECT_NE(s.dest, r);
          if (ring)
            EXPECT_EQ(s.dest, detail::ring_index(r - 1, W));
          else
            EXPECT_EQ(s.block, r);
          EXPECT_EQ(s.relayed, s.block != r);
          // Send j feeds step j + P at its destination: the same block and piece.
          const auto dest_steps = detail::all_gather_steps(s.dest, layout);
          EXPECT_EQ(dest_steps[j + 3].block, s.block);
          EXPECT_EQ(dest_steps[j + 3].piece, s.piece);
          if (s.relayed) {  // received by r at an earlier step than j + P
            const auto mine = detail::all_gather_steps(r, layout);
            const auto at = std::find_if(mine.begin(), mine.end(), [&](const auto& m) {
              return m.block == s.block && m.piece == s.piece;
            });
            EXPECT_LT(size_t(at - mine.begin()), j + 3);
          }
        }
      }
      EXPECT_EQ(delivered.size(), size_t(W * (W - 1) * 3));
    }
}

TEST(OverlapPlan, ReduceScatterHandlesBlockBAtStepBMinusRankMinusOneOwnLast) {
  for (int W : {1, 2, 3, 4}) {
    const ChunkLayout layout(5 * W, W, 2 * W);
    for (int r = 0; r < W; ++r) {
      const auto steps = detail::reduce_scatter_steps(r, layout);
      ASSERT_EQ(steps.size(), size_t(2 * W));
      EXPECT_EQ(steps.back().block, r);
      for (const auto& s : steps)
        EXPECT_EQ(s.step, detail::ring_index(s.block - r - 1, W)) << W << " " << r;
    }
  }
}

// --- the ops against the references ----------------------------------------------------------

// Runs the case on W thread ranks; returns rank 0's result, failing the test on any rank's error.
OverlapResult expect_case(int W, const OverlapCase& c) {
  std::mutex mutex;
  std::vector<OverlapResult> results(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) {
    OverlapResult r = run_overlap_case(comm, c);
    std::lock_guard lock(mutex);
    results[size_t(comm.rank())] = r;
  });
  for (const auto& r : results) EXPECT_EQ(r.error, "");
  return results[0];
}

class OverlapRanks : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { cpu::set_blas_threads(1); }  // ranks x BLAS threads <= cores
};

// M = 60, N = 84, K = 108: divisible by 1..4, not powers of two; chunks W, 2W, 3W and 5W cut
// M/W = 60, 30, 20, 15 rows (AllGatherGemm) or N = 84 columns (GemmReduceScatter) into 1, 2, 3
// or 5 pieces, unevenly for 15 / 2, 20 / 3 and 84 / 5.
// `thread`: with the communication thread; else min_overlap_bytes keeps every call on the
// calling thread (the schedule MPI ranks with off-node peers use).
void sweep(int W, OverlapKind kind, bool thread = true) {
  for (DType dtype : {DType::f32, DType::bf16})
    for (OverlapOrder order : {OverlapOrder::all_pairs, OverlapOrder::ring})
      for (int per_rank : {1, 2, 3, 5}) {
        OverlapCase c;
        c.kind = kind;
        c.config = make_overlap_config(60, 84, 108, dtype, per_rank * W, order);
        if (!thread) c.config.min_overlap_bytes = int64_t(1) << 40;
        const OverlapResult r = expect_case(W, c);
        EXPECT_EQ(r.overlaps, thread && W > 1) << describe(c);
      }
}

TEST_P(OverlapRanks, AllGatherGemmMatchesAllGatherThenGemm) {
  sweep(GetParam(), OverlapKind::all_gather_gemm);
}

TEST_P(OverlapRanks, GemmReduceScatterMatchesGemmThenReduceScatter) {
  sweep(GetParam(), OverlapKind::gemm_reduce_scatter);
}

TEST_P(OverlapRanks, WithoutTheThreadBothOpsMatchToo) {
  sweep(GetParam(), OverlapKind::all_gather_gemm, /*thread=*/false);
  sweep(GetParam(), OverlapKind::gemm_reduce_scatter, /*thread=*/false);
}

// f16 (11 significant bits, a narrower range than bf16): both ops, both orders, uneven pieces.
TEST_P(OverlapRanks, F16BothOpsBothOrders) {
  const int W = GetParam();
  for (OverlapKind kind : {OverlapKind::all_gather_gemm, OverlapKind::gemm_reduce_scatter})
    for (OverlapOrder order : {OverlapOrder::all_pairs, OverlapOrder::ring}) {
      OverlapCase c;
      c.kind = kind;
      c.config = make_overlap_config(60, 84, 108, DType::f16, 3 * W, order);
      expect_case(W, c);
    }
}

TEST_P(OverlapRanks, DefaultChunksAndOnePieceOfOneRowEach) {
  const int W = GetParam();
  for (OverlapKind kind : {OverlapKind::all_gather_gemm, OverlapKind::gemm_reduce_scatter})
    for (int chunks : {0, 36}) {  // 0: one per rank; 36 = M: every piece is one row
      OverlapCase c;
      c.kind = kind;
      c.config = make_overlap_config(36, 60, 84, DType::bf16, chunks, OverlapOrder::ring);
      expect_case(W, c);
    }
}

TEST_P(OverlapRanks, ManyCallsReuseTheBuffersWithoutBarriers) {
  const int W = GetParam();
  for (OverlapKind kind : {OverlapKind::all_gather_gemm, OverlapKind::gemm_reduce_scatter})
    for (OverlapOrder order : {OverlapOrder::all_pairs, OverlapOrder::ring}) {
      OverlapCase c;
      c.kind = kind;
      c.config = make_overlap_config(24, 12, 36, DType::f32, 2 * W, order);
      c.calls = 40;
      c.mix = CallMix::overlapped;
      expect_case(W, c);
      c.mix = CallMix::mixed;
      expect_case(W, c);
    }
}

INSTANTIATE_TEST_SUITE_P(W, OverlapRanks, ::testing::Values(1, 2, 3, 4));

TEST(Overlap, LargerPiecesOnTwoRanks) {
  cpu::set_blas_threads(1);
  for (OverlapKind kind : {OverlapKind::all_gather_gemm, OverlapKind::gemm_reduce_scatter}) {
    OverlapCase c;
    c.kind = kind;
    c.config = make_overlap_config(250, 130, 198, DType::bf16, 10);
    c.mix = CallMix::overlapped;
    expect_case(2, c);
  }
}

TEST(Overlap, IdenticalBytesRunAfterRun) {
  cpu::set_blas_threads(1);
  for (OverlapKind kind : {OverlapKind::all_gather_gemm, OverlapKind::gemm_reduce_scatter})
    for (DType dtype : {DType::f32, DType::bf16}) {
      OverlapCase c;
      c.kind = kind;
      c.config = make_overlap_config(60, 84, 108, dtype, 6, OverlapOrder::ring);
      c.mix = CallMix::overlapped;
      EXPECT_EQ(expect_case(3, c).digest, expect_case(3, c).digest) << describe(c);
    }
}

// Ring and all-pairs multiply the same pieces and add partial products in the same order, so in
// f32 (no rounding on the way) they agree bit for bit.
TEST(Overlap, RingAndAllPairsAgreeBitForBitInF32) {
  cpu::set_blas_threads(1);
  for (OverlapKind kind : {OverlapKind::all_gather_gemm, OverlapKind::gemm_reduce_scatter}) {
    OverlapCase c;
    c.kind = kind;
    c.config = make_overlap_config(60, 84, 108, DType::f32, 8, OverlapOrder::all_pairs);
    c.mix = CallMix::overlapped;
    const uint64_t all_pairs = expect_case(4, c).digest;
    c.config.order = OverlapOrder::ring;
    EXPECT_EQ(expect_case(4, c).digest, all_pairs) << describe(c);
  }
}

// run_gemm_only() does run()'s GEMMs and nothing else: after a run() with the same inputs,
// AllGatherGemm's gathered buffer holds the same A, so C comes out identical; GemmReduceScatter
// does not write C at all. Neither disturbs the signals: a run() afterwards still matches.
TEST(Overlap, GemmOnlyRepeatsTheGemmsWithoutCommunicating) {
  cpu::set_blas_threads(1);
  const int W = 3;
  for (bool gather : {true, false}) {
    const OverlapConfig cfg = make_overlap_config(60, 84, 108, DType::bf16, 6);
    run_ranks(W, [&](Communicator& comm) {
      const auto in = gather ? reference::make_all_gather_gemm_inputs(cfg, W, comm.rank(), 3)
                             : reference::make_gemm_reduce_scatter_inputs(cfg, W, comm.rank(), 3);
      Buffer C =
          gather ? Buffer(cfg.dtype, {cfg.m, cfg.n / W}) : Buffer(cfg.dtype, {cfg.m / W, cfg.n});
      Buffer again =
          gather ? Buffer(cfg.dtype, {cfg.m, cfg.n / W}) : Buffer(cfg.dtype, {cfg.m / W, cfg.n});
      auto use = [&](auto& op) {
        op.run(in.A, in.B, C);
        std::memset(again.data<void>(), 0x7B, again.nbytes());
        if (comm.rank() == 1) {  // one rank only: no peer takes part
          op.run_gemm_only(in.A, in.B, again);
          if (gather) {
            EXPECT_EQ(std::memcmp(C.data<void>(), again.data<void>(), C.nbytes()), 0);
          } else {
            for (size_t i = 0; i < again.nbytes(); ++i)
              ASSERT_EQ(again.data<unsigned char>()[i], 0x7B) << "byte " << i;
          }
        }
        std::memset(again.data<void>(), 0xFF, again.nbytes());
        op.run(in.A, in.B, again);
        EXPECT_EQ(std::memcmp(C.data<void>(), again.data<void>(), C.nbytes()), 0);
      };
      if (gather) {
        AllGatherGemm op(comm, cfg);
        use(op);
      } else {
        GemmReduceScatter op(comm, cfg);
        use(op);
      }
    });
  }
}

// The thread is used from min_overlap_bytes moved per call and rank: AllGatherGemm on 2 ranks
// moves one block of A (30 x 108 bf16 = 6480 bytes), GemmReduceScatter one of C (30 x 84 x 2).
TEST(Overlap, TheThreadStartsAtMinOverlapBytes) {
  run_ranks(2, [](Communicator& comm) {
    OverlapConfig cfg = make_overlap_config(60, 84, 108, DType::bf16);
    cfg.min_overlap_bytes = 6480;
    EXPECT_TRUE(AllGatherGemm(comm, cfg).overlaps());
    cfg.min_overlap_bytes = 6481;
    EXPECT_FALSE(AllGatherGemm(comm, cfg).overlaps());
    cfg.min_overlap_bytes = 5040;
    EXPECT_TRUE(GemmReduceScatter(comm, cfg).overlaps());
    cfg.min_overlap_bytes = 5041;
    EXPECT_FALSE(GemmReduceScatter(comm, cfg).overlaps());
    EXPECT_FALSE(AllGatherGemm(comm, OverlapConfig{60, 84, 108}).overlaps());  // default: 1 MiB
  });
}

TEST(Overlap, ReportsWorkspaceAndTheResolvedConfig) {
  run_ranks(2, [](Communicator& comm) {
    const OverlapConfig cfg = make_overlap_config(60, 84, 108, DType::bf16);
    AllGatherGemm ag(comm, cfg);
    EXPECT_GE(ag.workspace_bytes(), size_t(60 * 108 * 2));  // the gathered A, in bf16
    EXPECT_EQ(ag.config().chunks, 0);                       // as given
    GemmReduceScatter rs(comm, cfg);
    EXPECT_GE(rs.workspace_bytes(), size_t(60 * 84 * 2 + 60 * 84 * 4));  // slots + f32 partial
  });
}

// docs/design.md's example, kept true.
TEST(Overlap, ReadmeExample) {
  cpu::set_blas_threads(1);
  pmoe::run_ranks(2, [](pmoe::Communicator& comm) {
    pmoe::OverlapConfig cfg;
    cfg.m = 256, cfg.n = 1024, cfg.k = 1024;  // global sizes, as the seed's harness takes them
    cfg.dtype = pmoe::DType::bf16;
    cfg.chunks = 4;                             // pieces of M: a multiple of W (default W)
    cfg.order = pmoe::OverlapOrder::all_pairs;  // or ring
    const int64_t W = comm.size();

    pmoe::AllGatherGemm ag(comm, cfg);  // collective; buffers sized once
    pmoe::Buffer A(cfg.dtype, {cfg.m / W, cfg.k}), B(cfg.dtype, {cfg.k, cfg.n / W});
    pmoe::Buffer C(cfg.dtype, {cfg.m, cfg.n / W});
    // ... fill A and B ...
    reference::fill_operand(A, 1, reference::Operand::a, comm.rank() * (cfg.m / W), 0);
    reference::fill_operand(B, 1, reference::Operand::b, 0, comm.rank() * (cfg.n / W));
    ag.run(A, B, C);         // C = all_gather_rows(A) . B, the all-gather behind the GEMM
    ag.run_serial(A, B, C);  // the baseline: all-gather, then one GEMM

    pmoe::GemmReduceScatter rs(comm, cfg);
    pmoe::Buffer A2(cfg.dtype, {cfg.m, cfg.k / W}), B2(cfg.dtype, {cfg.k / W, cfg.n});
    pmoe::Buffer C2(cfg.dtype, {cfg.m / W, cfg.n});
    rs.run(A2, B2, C2);  // C2 = rows [r M/W, (r+1) M/W) of the sum over ranks of A2 . B2

    const auto want =
        reference::sampled_reference(true, cfg, 2, comm.rank(), 1, {0, 127, 255}, {0, 1, 511});
    EXPECT_EQ(reference::compare_close("C", C, want), "");
    for (size_t i = 0; i < C2.nbytes(); ++i) ASSERT_EQ(C2.data<unsigned char>()[i], 0);  // 0 . 0
  });
}

}  // namespace
}  // namespace pmoe::testing
