// 4 MPI processes on the emulated CUDA device (ctest runs it under mpiexec -n 4), as 2 nodes x 2
// ranks and 4 nodes x 1, direct and hierarchical (relays forward to their node's other process;
// with 1 rank a node, to themselves): CUDA AllToAll with ranks_per_node, node peers through the
// emulated CUDA IPC, off-node peers through the emulated remote path between processes (each
// rank's proxy delivers into the peers' regions that this process maps, keeping only GIN's
// ordering), against the reference, bit-identical to the same calls on one node, with the remote
// bytes counted.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <string>

#include "all_to_all_cases.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "pmoe/mpi_communicator.hpp"

namespace pmoe::testing {
namespace {

uint64_t sum_over_ranks(uint64_t mine) {
  uint64_t all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return all;
}

// Runs `c` split into nodes of `per_node` and again on one node: both must match the reference
// (each rank checks its own outputs), give the same bytes, and the split run must have sent bytes
// through the remote path (on every rank that has tokens: each routes some to another node).
struct Split {
  int per_node;
  CrossNode cross_node;
};

void expect_split_case(Communicator& comm, AllToAllCase c, Split split_as) {
  const int per_node = split_as.per_node;
  c.device = comm.device();
  c.config.ranks_per_node = per_node;
  c.config.cross_node = split_as.cross_node;
  const CaseResult split = run_all_to_all_case(comm, c);
  EXPECT_EQ(split.error, "") << "ranks_per_node " << per_node;
  if (c.tokens != TokenCounts::zero_on_odd) {  // a rank with no tokens may send no payload
    EXPECT_GT(split.remote_bytes, 0u) << "rank " << comm.rank() << " sent nothing remote";
  }
  c.config.ranks_per_node = 0;
  c.config.cross_node = CrossNode::direct;
  const CaseResult whole = run_all_to_all_case(comm, c);
  EXPECT_EQ(whole.error, "");
  EXPECT_EQ(whole.remote_bytes, 0u) << "one node, yet bytes went through the remote path";
  EXPECT_EQ(split.digest, whole.digest) << "ranks_per_node " << per_node << " changed the bytes";
  // Counted once per process, so a rank whose proxy delivered nothing could not hide.
  EXPECT_GE(sum_over_ranks(split.remote_bytes), uint64_t(comm.size()));
}

AllToAllCase base(int W) {
  AllToAllCase c;
  c.config = make_config(/*max_tokens=*/9, /*experts=*/2 * W, /*top_k=*/3, /*hidden=*/64);
  c.calls = 3;
  return c;
}

class CudaRemoteMpi : public ::testing::TestWithParam<Split> {
 protected:
  void SetUp() override { PMOE_REQUIRE_CUDA_RUNTIME(); }
};

TEST_P(CudaRemoteMpi, RandomRoutingEveryDtype) {
  MpiCommunicator comm(MPI_COMM_WORLD, Device::cuda(0));
  ASSERT_EQ(comm.size(), 4) << "registered with mpiexec -n 4";
  for (DType in : {DType::f32, DType::bf16, DType::f16}) {
    AllToAllCase c = base(comm.size());
    c.config.in_dtype = in;
    c.config.out_dtype = in == DType::f32 ? DType::bf16 : DType::f32;
    c.expert_y_dtype = in == DType::f16 ? DType::f32 : in;
    c.seed = 11 + uint64_t(in);
    expect_split_case(comm, c, GetParam());
  }
  AllToAllCase f8 = base(comm.size());
  f8.config.in_dtype = DType::f8e4m3;
  f8.config.hidden_dim = 256;
  f8.config.scale_block = 128;
  f8.expert_y_dtype = DType::bf16;
  expect_split_case(comm, f8, GetParam());
}

// -1 slots and m = 0 on odd ranks, split phases, int64 indices, k = E: the shapes that move the
// remote path's counts and staging the most.
TEST_P(CudaRemoteMpi, EdgeCases) {
  MpiCommunicator comm(MPI_COMM_WORLD, Device::cuda(0));
  AllToAllCase dropped = base(comm.size());
  dropped.routing = reference::Routing::dropped;
  dropped.tokens = TokenCounts::zero_on_odd;
  dropped.split_phases = true;
  expect_split_case(comm, dropped, GetParam());
  AllToAllCase wide = base(comm.size());
  wide.config.top_k = wide.config.num_experts;
  wide.i64_indices = true;
  expect_split_case(comm, wide, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Nodes, CudaRemoteMpi,
                         ::testing::Values(Split{2, CrossNode::direct}, Split{1, CrossNode::direct},
                                           Split{2, CrossNode::hierarchical},
                                           Split{1, CrossNode::hierarchical}),
                         [](const auto& info) {
                           const Split s = info.param;
                           const char* split = s.per_node == 2 ? "TwoNodesOfTwo" : "FourNodesOfOne";
                           return std::string(split) +
                                  (s.cross_node == CrossNode::hierarchical ? "Hierarchical" : "");
                         });

}  // namespace
}  // namespace pmoe::testing
