// Ranks that build a collective object from different configs, or one rank that rejects its own,
// get an error on every rank at construction: never a crash, never a wait for the timeout.
// Ranks are threads; mpi/test_mpi_config_agreement.cpp runs the same cases over MPI.
#include <gtest/gtest.h>

#include <mutex>

#include "agreement_cases.hpp"

namespace pmoe::testing {
namespace {

class ConfigAgreement : public ::testing::TestWithParam<int> {};

TEST_P(ConfigAgreement, EveryRankNamesTheField) {
  const int W = GetParam();
  for (const AgreementCase& c : agreement_cases(W)) {
    std::mutex mutex;
    std::vector<std::string> failures;
    run_ranks(W, [&](Communicator& comm) {
      const std::string failure = check_agreement_case(comm, c);
      std::lock_guard lock(mutex);
      if (!failure.empty()) failures.push_back(failure);
    });
    for (const std::string& f : failures) ADD_FAILURE() << f;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ConfigAgreement, ::testing::Values(2, 3));

}  // namespace
}  // namespace pmoe::testing
