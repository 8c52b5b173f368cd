// The config-agreement cases of test_config_agreement.cpp with ranks as MPI processes: every
// process must throw at construction, naming the field or the rank that rejected its config.
#include <gtest/gtest.h>
#include <mpi.h>

#include "agreement_cases.hpp"
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
