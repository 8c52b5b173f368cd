// AllToAll between MPI processes sharing GPU 0 through CUDA IPC (ctest runs it under
// mpiexec -n 2): the CPU cases against the same reference. Built for the emulated device and for
// a GPU (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>
#include <dirent.h>
#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "all_to_all_cases.hpp"
#include "core/device_runtime.hpp"
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

// The emulated device names IPC'd memory in /dev/shm; once every peer has opened it the name is
// gone, so a process killed before its free leaves nothing behind (CUDA has no such names).
TEST(AllToAllCudaIpc, EmulatedIpcNamesAreDroppedOnceMapped) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  if (!kOnEmulatedDevice) GTEST_SKIP() << "CUDA's IPC handles have no names";
  MpiCommunicator comm(MPI_COMM_WORLD, Device::cuda(0));
  const char* env = std::getenv("PMOE_SHM_PREFIX");
  const std::string prefix = std::string(env && *env ? env : "pmoe") + ".emu.";
  auto emulated_names = [&] {
    int count = 0;
    if (DIR* dir = opendir("/dev/shm")) {
      while (dirent* entry = readdir(dir)) count += std::string(entry->d_name).rfind(prefix, 0) == 0;
      closedir(dir);
    }
    return count;
  };
  auto memory = comm.alloc_symmetric(4096, 1);
  comm.barrier();  // every rank's alloc_symmetric has returned
  EXPECT_EQ(emulated_names(), 0) << "names under " << prefix << " while the memory is mapped";
  // The mappings work without the names: each rank's peer sees what this rank wrote.
  const int peer = (comm.rank() + 1) % comm.size();
  const uint32_t mine = 0xabc00 + uint32_t(comm.rank());
  detail::copy_bytes(memory->local(), comm.device(), &mine, Device::cpu(), sizeof mine);
  comm.barrier();
  uint32_t theirs = 0;
  detail::copy_bytes(&theirs, Device::cpu(), memory->peer(peer), comm.device(), sizeof theirs);
  EXPECT_EQ(theirs, 0xabc00 + uint32_t(peer));
}

}  // namespace
}  // namespace pmoe::testing
