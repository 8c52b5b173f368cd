// AllToAll with ranks as MPI processes (ctest runs it under mpiexec -n 4), against the same
// reference and cases as the thread tests. Run twice by ctest: with node-local shared memory,
// and with PMOE_MPI_SHM=0, where every peer is reached through MPI one-sided puts.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "all_to_all_cases.hpp"
#include "all_to_all_packed_cases.hpp"
#include "pmoe/error.hpp"
#include "pmoe/mpi_communicator.hpp"

namespace pmoe::testing {
namespace {

using reference::Routing;

// Runs `c` on all processes; each checks its own outputs. Returns this rank's digest.
uint64_t expect_case(const AllToAllCase& c) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const CaseResult result = run_all_to_all_case(comm, c);
  EXPECT_EQ(result.error, "");
  return result.digest;
}

AllToAllCase base(int W) {
  AllToAllCase c;
  c.config = make_config(/*max_tokens=*/9, /*experts=*/2 * W, /*top_k=*/3, /*hidden=*/40);
  c.calls = 3;
  return c;
}

int world_size() {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  return W;
}

TEST(AllToAllMpi, ReportsTransport) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const char* shm = std::getenv("PMOE_MPI_SHM");
  const size_t expected = shm && std::string(shm) == "0" ? 1 : size_t(comm.size());
  EXPECT_EQ(comm.node_ranks().size(), expected);
}

TEST(AllToAllMpi, RandomRoutingEveryDtype) {
  for (DType in : {DType::f32, DType::bf16, DType::f16}) {
    AllToAllCase c = base(world_size());
    c.config.in_dtype = in;
    c.expert_y_dtype = in;
    c.config.out_dtype = in == DType::f32 ? DType::bf16 : DType::f32;
    expect_case(c);
  }
}

TEST(AllToAllMpi, F8WithBlockScales) {
  AllToAllCase c = base(world_size());
  c.config.in_dtype = DType::f8e4m3;
  c.config.hidden_dim = 64;
  c.config.scale_block = 32;
  c.expert_y_dtype = DType::f32;
  expect_case(c);
}

TEST(AllToAllMpi, EdgeCases) {
  AllToAllCase zero = base(world_size());
  zero.tokens = TokenCounts::zero_on_odd;
  expect_case(zero);
  AllToAllCase hot = base(world_size());
  hot.routing = Routing::hot_expert;
  hot.tokens = TokenCounts::full;
  expect_case(hot);
  AllToAllCase dropped = base(world_size());
  dropped.routing = Routing::dropped;
  expect_case(dropped);
  AllToAllCase all_experts = base(world_size());
  all_experts.config.top_k = all_experts.config.num_experts;
  expect_case(all_experts);
}

TEST(AllToAllMpi, SplitPhasesAndManyCalls) {
  AllToAllCase c = base(world_size());
  c.config.max_tokens = 5;
  c.config.hidden_dim = 16;
  c.split_phases = true;
  c.calls = 200;
  expect_case(c);
}

TEST(AllToAllMpi, InPlaceBuffers) {
  for (DType in : {DType::bf16, DType::f8e4m3}) {
    AllToAllCase c = base(world_size());
    c.config.in_dtype = in;
    c.config.hidden_dim = 64;
    c.config.scale_block = in == DType::f8e4m3 ? 32 : 0;
    c.config.in_place_buffers = true;
    c.in_place = true;
    c.split_phases = in == DType::bf16;
    c.calls = 50;
    expect_case(c);
  }
}

// Packed rows over processes: in the op's padded buffers (in place, split phases), and in buffers
// of exactly the rows that arrive (arriving_rows(), with too few refused first). Off-node (the
// .offnode run), the heads arriving_rows() reads come by MPI messages.
TEST(AllToAllMpi, PackedExpertRows) {
  AllToAllCase c = base(world_size());
  c.config.packed_expert_rows = c.config.in_place_buffers = true;
  c.in_place = c.split_phases = true;
  c.calls = 20;
  expect_case(c);
  MpiCommunicator comm(MPI_COMM_WORLD);
  AllToAllConfig exact = make_config(7, 2 * comm.size(), 3, 20, DType::f32, DType::f32);
  exact.packed_expert_rows = true;
  EXPECT_EQ(run_exact_packed_rounds(comm, exact, 6, /*too_small=*/true), "");
}

TEST(AllToAllMpi, BitIdenticalAcrossRuns) {
  AllToAllCase c = base(world_size());
  EXPECT_EQ(expect_case(c), expect_case(c));
}

// Last, because it leaves one AllToAll mid-protocol: the last rank never calls dispatch.
TEST(AllToAllMpi, RankThatNeverArrivesIsNamed) {
  setenv("PMOE_TIMEOUT_S", "2", 1);
  MpiCommunicator comm(MPI_COMM_WORLD);
  unsetenv("PMOE_TIMEOUT_S");
  const int W = comm.size(), missing = W - 1;
  const AllToAllConfig cfg = make_config(4, 2 * W, 2, 32);
  AllToAll a2a(comm, cfg);
  if (comm.rank() == missing) {
    std::this_thread::sleep_for(std::chrono::seconds(3));  // outlasts the others' 2 s timeout
    comm.barrier();
    return;
  }
  const auto in = reference::make_inputs(cfg, comm.rank(), 4, 9, Routing::random);
  Buffer counts(DType::i32, {cfg.num_experts / W});
  Buffer expert_x(cfg.in_dtype, {cfg.num_experts / W, int64_t(W) * 4, 32});
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    a2a.dispatch(in.x, Tensor(), in.indices, counts, expert_x, Tensor());
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_NE(error.find("rank " + std::to_string(missing) + " did not arrive within 2 s"),
            std::string::npos)
      << error;
  comm.barrier();
}

}  // namespace
}  // namespace pmoe::testing
