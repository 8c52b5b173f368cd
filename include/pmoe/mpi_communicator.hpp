// MpiCommunicator: ranks are MPI processes (launch with mpirun / mpiexec). Kept apart from
// comm.hpp so that code using thread ranks only does not need mpi.h.
//
// Peers on the same node share symmetric memory through POSIX shared memory, loaded and stored
// directly. Peers on other nodes are reached through MPI messages that the target applies to its
// memory while it waits (src/comm/mpi_transport.hpp says why not one-sided puts).
// PMOE_MPI_SHM=0 treats every other rank as off-node, to test that path on one machine.
#pragma once

#include <mpi.h>

#include <string>

#include "pmoe/comm.hpp"

namespace pmoe {

namespace detail {
class MpiTransport;
}

class MpiCommunicator final : public Communicator {
 public:
  // Collective over `comm`, which it duplicates, so pmoe's messages never match the caller's.
  // MPI must be initialised; destroy the communicator before MPI_Finalize. With a CUDA `device`
  // (this process's GPU), the rank gets a stream and its symmetric memory is device memory that
  // the node's other processes map through CUDA IPC (every rank must then be on one node).
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD, Device device = Device::cpu());
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override;
  std::vector<std::byte> all_gather(std::span<const std::byte> mine) override;
  void broadcast(std::span<std::byte> data, int root) override;
  std::vector<int> node_ranks() const override { return node_ranks_; }
  std::unique_ptr<SymmetricMemory> alloc_symmetric(size_t bytes, int signal_slots) override;
  std::unique_ptr<SymmetricMemory> alloc_host_symmetric(size_t bytes) override;

  MPI_Comm comm() const { return comm_; }

 private:
  // alloc_symmetric in `where`'s memory: this rank's device, or the host.
  std::unique_ptr<SymmetricMemory> alloc_symmetric_in(Device where, size_t bytes,
                                                      int signal_slots);
  // Completes `request` with a bounded wait; `what` names the operation for the error.
  void wait(MPI_Request& request, const char* what);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> node_ranks_;
  std::shared_ptr<detail::MpiTransport> transport_;  // to off-node peers
  std::string job_id_;        // makes shared-memory names unique to this communicator
  uint64_t allocations_ = 0;  // symmetric allocations so far, for their names
};

}  // namespace pmoe
