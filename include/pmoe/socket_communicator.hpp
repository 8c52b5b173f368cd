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

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pmoe/comm.hpp"

namespace pmoe {

namespace detail {
class SocketTransport;
struct SocketRegions;
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

  // A new process in the place of rank `rank`, whose process ended (docs/robustness.md, "A new
  // process in a dead one's place"). The same arguments as the constructor's, where
  // addresses[rank] is this process's own listener's (the others keep theirs); every other rank
  // calls admit(rank) meanwhile. Connects to every other rank and takes the job's picture from
  // them: it must be the one they were given, but for this rank's address (checked on every
  // rank, pmoe::Error otherwise). Each op it then builds in replacing mode (AllToAll's
  // constructor with AllToAll::Replacing) takes over the lost rank's memory instead of
  // allocating new. One node's shared memory on the CPU only, so far: a CUDA device is refused.
  static std::unique_ptr<SocketCommunicator> replacing(Listener&& listener, int rank,
                                                       std::vector<std::string> addresses,
                                                       std::vector<std::string> nodes,
                                                       std::string job_id,
                                                       Device device = Device::cpu());
  // Collective over every other rank and the newcomer's replacing(): takes the connection of the
  // process now in `rank`'s place on this rank's listener (bounded by the timeout), checks the
  // picture of the job, and watches the new process instead of the dead one. Throws pmoe::Error,
  // having changed nothing, for a rank out of range, this rank, a rank whose connection is still
  // open (it lives: mask it and stop it first), a rank with no peer on its node (its memory is
  // gone with it), or a CUDA device. Between calls: no other thread of this rank may wait on the
  // communicator meanwhile. Ops are admitted afterwards, one by one (AllToAll::admit).
  void admit(int rank);
  // Collective over the survivors and the newcomer `rank`: gives the newcomer `memory`, which
  // its matching alloc_symmetric takes over as the lost rank's (the node's segments, passed as
  // descriptors over a Unix socket, since their names are gone). Ops call it from their admit.
  void hand_over(SymmetricMemory& memory, int rank) override;

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
  struct Replacing {};
  SocketCommunicator(Replacing, Listener&& listener, int rank, std::vector<std::string> addresses,
                     std::vector<std::string> nodes, std::string job_id, Device device);
  // The picture of the job every rank must share: addresses, node names, job id, device kind.
  uint64_t job_digest(const std::vector<std::string>& addresses) const;
  // The rest of admit() and replacing(), on every rank once `newcomer`'s connections are up.
  void welcome(int newcomer, const std::vector<std::string>& addresses);
  // The hand-over's side on the newcomer: allocation `serial`'s node segments, received from
  // the sponsor (socket_admission.cpp). Returns "" or what failed.
  std::string adopt_segments(detail::SocketRegions& regions, std::vector<std::byte*>& data, size_t total,
                      uint64_t serial);
  // The lowest rank other than `newcomer` on its node: it holds every segment and passes them.
  int sponsor_of(int newcomer) const;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> node_ranks_;
  std::shared_ptr<detail::SocketTransport> transport_;
  std::string job_id_;
  uint64_t allocations_ = 0;
  std::vector<std::string> addresses_, nodes_;
  // Each live allocation on the CPU, by its local data: what hand_over() passes on.
  std::map<const std::byte*, std::weak_ptr<detail::SocketRegions>> allocations_by_data_;
  // Unix sockets that carry descriptors: the sponsor's, one per newcomer; the newcomer's, to its
  // sponsor (-1 until replacing() made it).
  std::map<int, int> channels_;
  int channel_to_sponsor_ = -1;
};

}  // namespace pmoe
