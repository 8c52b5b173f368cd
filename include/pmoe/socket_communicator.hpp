// SocketCommunicator: ranks are processes of a job started by a launcher pmoe does not own
// (torchrun), with no MPI. The launcher's own group exchanges, once, each rank's listening
// address and node name (python/pmoe/torch/ does it through torch.distributed); from then on pmoe
// talks over its own TCP mesh (src/comm/socket_transport.hpp says why).
//
// Ranks that name the same node share symmetric memory through POSIX shared memory, loaded and
// stored directly; ranks on other nodes get puts and signals as TCP frames that the target
// applies while it waits. With a CUDA device, the symmetric memory is device memory that the
// node's processes map through CUDA IPC (the emulated device: POSIX shared memory), and ops run
// on the rank's stream(); an op across nodes takes the GIN path (NCCL's window, set up over this
// communicator's own collectives), never these TCP frames.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "pmoe/comm.hpp"

namespace pmoe {

namespace detail {
class SocketTransport;
}

class SocketCommunicator final : public Communicator {
 public:
  // A listening TCP socket on `bind_host` (e.g. "0.0.0.0"), port chosen by the kernel. Open it
  // before the addresses are exchanged, so that peers can connect as soon as they know it.
  class Listener {
   public:
    explicit Listener(const std::string& bind_host = "0.0.0.0");
    ~Listener();
    Listener(Listener&& other) noexcept;
    Listener(const Listener&) = delete;
    Listener& operator=(const Listener&) = delete;
    int port() const { return port_; }

   private:
    friend class SocketCommunicator;
    int fd_ = -1;
    int port_ = 0;
  };

  // Collective. rank in [0, size); addresses[r] is rank r's "host:port" (its Listener's port,
  // on a host name or address the other ranks can reach); nodes[r] names rank r's node (ranks
  // with the same name share memory); job_id is the same string on every rank and unique to
  // this communicator on the node (it names the shared-memory segments). Takes over `listener`.
  // `device`: cpu, or this process's GPU cuda:N (the rank gets its own stream on it). Checks that
  // every rank passed the same size, addresses, nodes, job_id and kind of device, and throws
  // pmoe::Error on every rank otherwise (and where this build has no CUDA device to run on).
  SocketCommunicator(Listener&& listener, int rank, std::vector<std::string> addresses,
                     std::vector<std::string> nodes, std::string job_id,
                     Device device = Device::cpu());
  ~SocketCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override;
  std::vector<std::byte> all_gather(std::span<const std::byte> mine) override;
  void broadcast(std::span<std::byte> data, int root) override;
  std::vector<int> node_ranks() const override { return node_ranks_; }
  std::unique_ptr<SymmetricMemory> alloc_symmetric(size_t bytes, int signal_slots) override;
  std::unique_ptr<SymmetricMemory> alloc_host_symmetric(size_t bytes) override;

 private:
  // alloc_symmetric in `where`'s memory: this rank's device, or the host.
  std::unique_ptr<SymmetricMemory> alloc_symmetric_in(Device where, size_t bytes,
                                                      int signal_slots);
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> node_ranks_;
  std::shared_ptr<detail::SocketTransport> transport_;
  std::string job_id_;
  uint64_t allocations_ = 0;
};

}  // namespace pmoe
