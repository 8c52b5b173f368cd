// The config-agreement cases of test_config_agreement.cpp with ranks as MPI processes: every
// process must throw at construction, naming the field or the rank that rejected its config.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <string>

#include "agreement_cases.hpp"
#include "all_to_all_cases.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/error.hpp"
#include "pmoe/mpi_communicator.hpp"

namespace pmoe::testing {
namespace {

TEST(ConfigAgreementMpi, EveryRankNamesTheField) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  for (const AgreementCase& c : agreement_cases(comm.size())) {
    const std::string failure = check_agreement_case(comm, c);
    EXPECT_EQ(failure, "");
  }
}

}  // namespace
}  // namespace pmoe::testing

namespace pmoe::testing {
namespace {

// A call rejected on one process never reaches its peers, which wait for it; when their wait
// times out they name the rejected call, read from the rank's slot in node-shared memory. With
// PMOE_MPI_SHM=0 no peer shares memory with it, and the message says where to look instead.
TEST(RejectedCallMpi, PeersThatTimeOutNameIt) {
  setenv("PMOE_TIMEOUT_S", "1", 1);
  std::string error;
  int rank = 0, W = 0;
  {
    MpiCommunicator comm(MPI_COMM_WORLD);
    rank = comm.rank();
    W = comm.size();
    const AllToAllConfig cfg = make_config(4, 2 * W, 2, 32, DType::f32, DType::f32);
    AllToAll a2a(comm, cfg);
    const int64_t L = cfg.num_experts / W, rows = int64_t(W) * cfg.max_tokens;
    Buffer x(DType::f32, {4, 32}), indices(DType::i32, {4, 2}), counts(DType::i32, {L}),
        expert_x(DType::f32, {L, rows, 32}), wrong(DType::bf16, {4, 32});
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < 2; ++j) indices.data<int32_t>()[t * 2 + j] = (t + j) % cfg.num_experts;
    try {
      a2a.dispatch(rank == W - 1 ? wrong : x, Tensor(), indices, counts, expert_x, Tensor());
    } catch (const Error& e) {
      error = e.what();
    }
  }
  unsetenv("PMOE_TIMEOUT_S");
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string odd = std::to_string(W - 1);
  if (rank == W - 1) {
    EXPECT_NE(error.find("`x` must be f32 (float32), got bf16 (bfloat16)"), std::string::npos)
        << error;
    return;
  }
  EXPECT_NE(error.find("rank " + odd + " did not arrive within 1 s"), std::string::npos) << error;
  const char* shm = std::getenv("PMOE_MPI_SHM");
  if (shm && std::string(shm) == "0")
    EXPECT_NE(error.find("if rank " + odd + " threw, its own error says why"), std::string::npos)
        << error;
  else
    EXPECT_NE(error.find("rank " + odd + " rejected its call (AllToAll::dispatch: `x` must be "
                         "f32 (float32), got bf16 (bfloat16))"),
              std::string::npos)
        << error;
}

}  // namespace
}  // namespace pmoe::testing
