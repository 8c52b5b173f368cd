// AllToAll between MPI processes sharing GPU 0 through CUDA IPC (ctest runs it under
// mpiexec -n 2): the CPU cases against the same reference. Built for the emulated device and for
// a GPU (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>
#include <mpi.h>

#include "all_to_all_cases.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "pmoe/mpi_communicator.hpp"

namespace pmoe::testing {
namespace {

TEST(AllToAllCudaIpc, ProcessesOnOneGpu) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  MpiCommunicator comm(MPI_COMM_WORLD, Device::cuda(0));
  const int W = comm.size();
  for (DType in : {DType::bf16, DType::f8e4m3}) {
    AllToAllCase c;
    c.config = make_config(8, 2 * W, 3, 256, in, DType::bf16, in == DType::f8e4m3 ? 128 : 0);
    c.routing = reference::Routing::dropped;
    c.calls = 5;
    c.device = comm.device();
    EXPECT_EQ(run_all_to_all_case(comm, c).error, "");
  }
}

}  // namespace
}  // namespace pmoe::testing
