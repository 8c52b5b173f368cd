// Configs that differ between ranks, or that one rank rejects, for every collective object:
// AllToAll, TpMoe, EpMoe, AllGatherGemm and GemmReduceScatter. Shared by the thread-rank test
// (test_config_agreement.cpp) and the MPI one (mpi/test_mpi_config_agreement.cpp): every rank must
// throw, at construction, an error naming the field (or the rejecting rank), and none may wait.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "pmoe/comm.hpp"

namespace pmoe::testing {

struct AgreementCase {
  std::string name;  // "AllToAll.num_experts"
  // Builds the object on this rank; rank `odd_rank` uses the changed config.
  std::function<void(Communicator&, bool odd_rank)> build;
  // What every rank's error must contain; `rank_rejected` cases differ on the rejecting rank.
  std::string expected;
  std::string expected_on_odd_rank;  // "" means `expected`
};

// The cases for `world_size` ranks (>= 2).
std::vector<AgreementCase> agreement_cases(int world_size);

// Runs one case on this rank (collective); returns "" when this rank's error is the expected
// one, else what went wrong. The odd rank is world_size - 1.
std::string check_agreement_case(Communicator& comm, const AgreementCase& c);

}  // namespace pmoe::testing
