// MPI processes, one GPU each or all sharing GPU 0, ranks_per_node from PMOE_GIN_RANKS_PER_NODE
// (default: the ranks of this node), at least two nodes: the GPU remote path end to end on real
// hardware (src/cuda/transport/gin_ring_check.hpp): NcclGin set up, node peers' LSA pointers,
// then two rounds of put / put_signal / signal_add / flush to the rank one node on, the bytes
// received checked against the pattern. Not a ctest test (no GPU here): scripts/device_checks.sh
// runs it (part gin), and docs/gpu.md shows how on two nodes.
//
// Exit status: 0 passed; 1 a check failed; 77 the remote path could not be set up here (no NIC
// for GIN, NCCL refusing two ranks on one GPU, no libnccl), with NCCL's reason printed.
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include "cuda/check.hpp"
#include "cuda/transport/gin_ring_check.hpp"
#include "cuda/transport/nccl_gin.hpp"
#include "pmoe/mpi_communicator.hpp"

namespace {

int run() {
  using namespace pmoe;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("GIN remote path unavailable here: no CUDA device\n");
    return 77;
  }
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MpiCommunicator probe(MPI_COMM_WORLD);
  const int local =
      int(std::find(probe.node_ranks().begin(), probe.node_ranks().end(), world_rank) -
          probe.node_ranks().begin());
  MpiCommunicator comm(MPI_COMM_WORLD, Device::cuda(local % devices));
  const char* env = std::getenv("PMOE_GIN_RANKS_PER_NODE");
  pmoe::cuda::GinRequest request;
  request.ranks_per_node = env ? std::atoi(env) : int(probe.node_ranks().size());
  constexpr size_t kChunk = 1 << 20;  // several GIN messages, and an odd tail below
  request.region_bytes = 3 * (kChunk + 4099);
  request.signal_slots = 2;

  const auto stream = static_cast<cudaStream_t>(comm.stream().handle);
  std::unique_ptr<pmoe::cuda::NcclGin> gin;
  try {
    gin = std::make_unique<pmoe::cuda::NcclGin>(comm, request);
    const auto direct = gin->direct_windows(stream);
    for (int r = 0; r < comm.size(); ++r) {
      const bool same_node = r / request.ranks_per_node == comm.rank() / request.ranks_per_node;
      PMOE_CHECK((direct[size_t(r)] != nullptr) == same_node, "direct window of rank ", r,
                 same_node ? " missing" : " given for another node");
    }
  } catch (const std::exception& e) {
    std::printf("rank %d: GIN remote path unavailable here: %s\n", comm.rank(), e.what());
    return 77;
  }
  int failed = 0;
  for (uint64_t round = 1; round <= 2; ++round) {
    const auto result = pmoe::cuda::run_gin_ring_check(*gin, stream, kChunk + 4099, round,
                                                       uint64_t(comm.timeout_s() * 1e9));
    std::printf("rank %d round %llu: %s, %lld wrong bytes of %zu\n", comm.rank(),
                static_cast<unsigned long long>(round),
                result.arrived ? "both signals arrived" : "TIMED OUT waiting for the signals",
                static_cast<long long>(result.wrong_bytes), 2 * (kChunk + 4099));
    failed |= !result.arrived || result.wrong_bytes != 0;
    comm.barrier();
  }
  gin->close();
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 1;
  try {
    status = run();
  } catch (const std::exception& e) {
    std::printf("gin_ring_gpu: %s\n", e.what());
  }
  int worst = 0;
  MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
