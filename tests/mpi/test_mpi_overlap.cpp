// AllGatherGemm and GemmReduceScatter with ranks as MPI processes (ctest runs it under
// mpiexec -n 4), against the same references and cases as the thread tests. Run twice: with
// node-local shared memory (a communication thread per rank), and with PMOE_MPI_SHM=0, where
// every peer is reached through MPI messages and the transfers stay on the rank's own thread.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <string>

#include "cpu/gemm.hpp"
#include "overlap_cases.hpp"
#include "pmoe/error.hpp"
#include "pmoe/mpi_communicator.hpp"
#include "reference/overlap_reference.hpp"

namespace pmoe::testing {
namespace {

bool shared_memory() {
  const char* shm = std::getenv("PMOE_MPI_SHM");
  return !(shm && std::string(shm) == "0");
}

int world_size() {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  return W;
}

void expect_case(const OverlapCase& c) {
  cpu::set_blas_threads(1);
  MpiCommunicator comm(MPI_COMM_WORLD);
  const OverlapResult result = run_overlap_case(comm, c);
  EXPECT_EQ(result.error, "");
  EXPECT_EQ(result.overlaps, shared_memory() && comm.size() > 1) << describe(c);
}

// M = 60, N = 84, K = 108 (not powers of two), chunks W, 2W, 3W and 5W (uneven pieces), every
// dtype and order.
void sweep(OverlapKind kind) {
  const int W = world_size();
  for (DType dtype : {DType::f32, DType::bf16})
    for (OverlapOrder order : {OverlapOrder::all_pairs, OverlapOrder::ring})
      for (int per_rank : {1, 2, 3, 5}) {
        OverlapCase c;
        c.kind = kind;
        c.config = make_overlap_config(60, 84, 108, dtype, per_rank * W, order);
        expect_case(c);
      }
}

TEST(OverlapMpi, AllGatherGemmMatchesAllGatherThenGemm) { sweep(OverlapKind::all_gather_gemm); }

TEST(OverlapMpi, GemmReduceScatterMatchesGemmThenReduceScatter) {
  sweep(OverlapKind::gemm_reduce_scatter);
}

TEST(OverlapMpi, ManyCallsReuseTheBuffers) {
  for (OverlapKind kind : {OverlapKind::all_gather_gemm, OverlapKind::gemm_reduce_scatter})
    for (OverlapOrder order : {OverlapOrder::all_pairs, OverlapOrder::ring}) {
      OverlapCase c;
      c.kind = kind;
      c.config = make_overlap_config(24, 12, 36, DType::bf16, 2 * world_size(), order);
      c.calls = 20;
      c.mix = CallMix::overlapped;
      expect_case(c);
    }
}

TEST(OverlapMpi, RejectsBadShapesOnEveryRankThenWorks) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int W = comm.size();
  OverlapConfig bad = make_overlap_config(4 * W + 1, 84, 108, DType::bf16);
  try {
    AllGatherGemm op(comm, bad);
    ADD_FAILURE() << "accepted M = " << bad.m;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be divisible by the world size"), std::string::npos)
        << e.what();
  }
  const OverlapConfig cfg = make_overlap_config(12 * W, 84, 108, DType::f32);
  GemmReduceScatter op(comm, cfg);
  const auto in = reference::make_gemm_reduce_scatter_inputs(cfg, W, comm.rank(), 2);
  Buffer C(cfg.dtype, {12, 84}), wrong(cfg.dtype, {12, 85});
  try {
    op.run(in.A, in.B, wrong);
    ADD_FAILURE() << "accepted C [12, 85]";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("`C` must have shape [12, 84], got [12, 85]"),
              std::string::npos)
        << e.what();
  }
  op.run(in.A, in.B, C);
  std::vector<reference::OverlapInputs> all;
  std::vector<Tensor> a_parts, b_parts;
  for (int r = 0; r < W; ++r)
    all.push_back(reference::make_gemm_reduce_scatter_inputs(cfg, W, r, 2));
  for (const auto& i : all) {
    a_parts.push_back(i.A);
    b_parts.push_back(i.B);
  }
  EXPECT_EQ(reference::compare_close(
                "C", C,
                reference::gemm_reduce_scatter_reference(a_parts, b_parts, comm.rank(), cfg.dtype)),
            "");
  comm.barrier();
}

}  // namespace
}  // namespace pmoe::testing
