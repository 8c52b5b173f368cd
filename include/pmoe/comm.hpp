// The runtime: a Communicator is one rank's view of a group of ranks; SymmetricMemory is memory
// allocated collectively, the same size on every rank, that peers write into directly; signals
// are 64-bit epoch slots inside it. run_ranks() runs a group as threads of this process;
// MpiCommunicator (pmoe/mpi_communicator.hpp) runs it as MPI processes.
//
// Every wait in here is bounded: it spins briefly, then yields and sleeps (ranks may outnumber
// cores), and throws pmoe::Error naming the rank it waited for once the timeout passes. The
// timeout is 60 s unless the environment variable PMOE_TIMEOUT_S says otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pmoe/stream.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe {

class Communicator;

namespace detail {
class Group;  // what a rank's waits consult: the failure of another rank, MPI progress
class NodeSplitMemory;  // src/comm/node_split.hpp
// The group of `comm`, for ops that watch peers themselves (src/comm/group.hpp).
const std::shared_ptr<Group>& group_of(const Communicator& comm);
}

// The wait timeout in seconds: PMOE_TIMEOUT_S if set to a positive number, else 60.
double timeout_from_env();

class SymmetricMemory;

class Communicator {
 public:
  virtual ~Communicator();

  virtual int rank() const = 0;
  virtual int size() const = 0;
  Device device() const { return device_; }
  // This rank's stream on a CUDA device (ops enqueue on it); the null Stream on the CPU.
  Stream stream() const { return stream_; }
  double timeout_s() const { return timeout_s_; }
  // A second stream on this rank's CUDA device, for work beside stream() (the overlap ops'
  // copies). Made on first use and kept as long as the communicator: a device's streams share its
  // hardware queues in creation order, so one made per op would in time share stream()'s queue,
  // where a spinning wait on one holds up the other's kernels.
  Stream side_stream();

  // Returns once every rank has called it; throws pmoe::Error naming the missing ranks on timeout.
  virtual void barrier() = 0;
  // Set-up only, never on a data path. `mine` has the same size on every rank; the result holds
  // every rank's bytes in rank order.
  virtual std::vector<std::byte> all_gather(std::span<const std::byte> mine) = 0;
  // Copies root's `data` into every rank's `data` (the same size on every rank).
  virtual void broadcast(std::span<std::byte> data, int root) = 0;
  // The ranks (this one included, ascending) whose SymmetricMemory this rank can load and store.
  virtual std::vector<int> node_ranks() const = 0;

  // Collective: every rank allocates `bytes` of zeroed data plus `signal_slots` zeroed signals.
  virtual std::unique_ptr<SymmetricMemory> alloc_symmetric(size_t bytes, int signal_slots) = 0;
  // Collective, as alloc_symmetric, but in host memory whatever the device: for small boards
  // that the ranks' host threads read and write beside a device's kernels. Ranks off this rank's
  // node get no mapping (peer() returns null for them).
  virtual std::unique_ptr<SymmetricMemory> alloc_host_symmetric(size_t bytes);
  // A new process in lost rank `rank`'s place builds each op again; an op's admit gives it the
  // op's `memory` (this rank's allocation, made by this communicator), which the newcomer's
  // matching alloc_symmetric takes over instead of allocating. Collective over the survivors and
  // the newcomer. Only communicators that admit new processes can (SocketCommunicator on one
  // node's shared memory); this default throws pmoe::Error.
  virtual void hand_over(SymmetricMemory& memory, int rank);

  // Throws if the group has failed (another thread rank threw). Cheap; ops call it at entry.
  void check_group() const;

  // An op on this rank rejected its call (`error`: what it threw), or, with "", a call passed
  // its checks. A rejected call never reaches the peers, which wait for it; one whose wait times
  // out names this rank's reason (where it can see it: thread ranks, and MPI ranks of one node).
  // Costs nothing while there is nothing to clear.
  void note_rejection(const std::string& error);

 protected:
  friend const std::shared_ptr<detail::Group>& detail::group_of(const Communicator& comm);
  Communicator(std::shared_ptr<detail::Group> group, Device device);
  const std::shared_ptr<detail::Group>& group() const { return group_; }
  void set_stream(Stream stream) { stream_ = stream; }

 private:
  std::shared_ptr<detail::Group> group_;
  Device device_;
  Stream stream_;
  Stream side_stream_;
  double timeout_s_;
  bool rejection_noted_ = false;
};

// Says what a wait was for, so that a timeout names the op, this rank, the peer and the event.
struct WaitFor {
  std::string_view op;     // "AllToAll::dispatch(recv)"
  int peer;                // the rank whose signal is awaited
  std::string_view event;  // "its dispatch data"
};

class SymmetricMemory {
 public:
  static constexpr size_t kSignalBytes = 64;  // one signal per cache line: no false sharing

  virtual ~SymmetricMemory();
  SymmetricMemory(const SymmetricMemory&) = delete;
  SymmetricMemory& operator=(const SymmetricMemory&) = delete;

  int rank() const { return rank_; }
  int size() const { return int(peer_data_.size()); }
  size_t bytes() const { return bytes_; }
  // Where the memory lives. On a CUDA device, local(), peer() and signal words are device
  // pointers for kernels; the host-side put/signal/wait below are for CPU memory only.
  Device device() const { return device_; }
  int signal_slots() const { return signal_slots_; }

  // This rank's region.
  std::byte* local() const { return peer_data_[rank_]; }
  // A load/store pointer into rank r's region, or null when r is not load/store reachable.
  std::byte* peer(int r) const { return peer_data_[r]; }

  // Copies `bytes` from `src` into rank r's region at `offset`; works for every peer.
  virtual void put(int r, size_t offset, const void* src, size_t bytes);
  // Sets rank r's signal `slot` to `value` with release semantics: everything this rank put to r
  // before is visible to r once r sees the value, and wakes r if it blocks in wait_signal.
  virtual void signal(int r, int slot, uint64_t value);

  // This rank's signal `slot`, read with acquire semantics.
  uint64_t read_signal(int slot) const;
  // Waits until this rank's signal `slot` is >= value. Throws pmoe::Error on timeout or when
  // the group fails.
  void wait_signal(int slot, uint64_t value, const WaitFor& what) const;
  // The same for an op that goes on without lost peers: between polls, `watch` stands in for the
  // check of node-local peers' processes (the op decides what a lost peer means) and may throw to
  // end the wait; `timeout_s` replaces the communicator's. A failed thread rank still fails it.
  void wait_signal(int slot, uint64_t value, const WaitFor& what,
                   const std::function<void()>& watch, double timeout_s) const;

 protected:
  // `data[r]` and `signals[r]` point at rank r's region and signal array, or are null where r is
  // not load/store reachable (then put() and signal() must be overridden for it). `keepalive`
  // owns whatever must outlive every access (mappings, heap regions).
  SymmetricMemory(int rank, size_t bytes, int signal_slots, std::vector<std::byte*> data,
                  std::vector<uint64_t*> signals, std::shared_ptr<void> keepalive,
                  std::shared_ptr<detail::Group> group, double timeout_s,
                  Device device = Device::cpu());

 public:
  // Rank r's signal word `slot` (for kernels, on a device).
  uint64_t* signal_word(int r, int slot) const;

 protected:

  virtual void progress() const {}  // called while waiting, for transports that need it
  // Set by transports whose signals land only when the waiter itself calls progress(): a wait
  // then naps briefly instead of blocking until woken.
  void set_polled_transport() { polled_transport_ = true; }

 private:
  friend class detail::NodeSplitMemory;  // wraps another SymmetricMemory, reading its fields
  template <typename Watch>
  void wait_signal_watched(int slot, uint64_t value, const WaitFor& what, Watch&& watch,
                           double timeout_s) const;
  std::string peer_rejection(int peer) const;  // for a timeout's message

  int rank_;
  size_t bytes_;
  int signal_slots_;
  std::vector<std::byte*> peer_data_;
  std::vector<uint64_t*> peer_signals_;
  std::shared_ptr<void> keepalive_;
  std::shared_ptr<detail::Group> group_;
  double timeout_s_;
  Device device_;
  bool polled_transport_ = false;
};

// Runs fn(comm) on n ranks, each a thread of this process, and returns when all have returned.
// If any rank throws, the other ranks' waits fail at once (instead of sitting out the timeout)
// and the first exception thrown is rethrown here. With a CUDA `device`, all ranks share that
// GPU: each gets its own stream (comm.stream()) and its symmetric memory is device memory that
// the peers' kernels load and store directly (the NVLink path, within one GPU). Such ranks share
// one CUDA context: run_ranks asks for eager module loading (CUDA_MODULE_LOADING=EAGER, unless
// set), which takes effect only if CUDA has not started in this process, and a rank must never
// synchronise the whole device, which waits for its peers' kernels (docs/gpu.md).
void run_ranks(int n, const std::function<void(Communicator&)>& fn,
               Device device = Device::cpu());

}  // namespace pmoe
