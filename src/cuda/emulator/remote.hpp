// The emulated device's remote path (one RemoteProxy per rank and op): kernels' puts and signal
// adds are queued per destination peer and delivered later, in a random order that keeps only
// GIN's promise, by a proxy thread that stands for the network: it copies into the peer's region
// and release-stores the peer's signal word through pointers this machine maps (thread ranks
// share the process; MPI processes of one machine map each other's regions), which the kernels
// themselves are denied (src/comm/node_split.hpp):
//
//   kernel thread --put/signal--> queue[peer]: op op op SIG op ...
//   proxy thread: picks a random peer, then a random put before the queue's first signal, or
//                 the signal once every put before it has landed; waits a little between ops.
//
// A put's source is read when it is delivered, not when it is issued: a kernel that reuses the
// source before flush() sends the new bytes, as a real NIC may. Counters: remote bytes and
// transfers this rank sent.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>


namespace pmoe::emu {

struct RemoteCounters {
  uint64_t bytes = 0;      // payload bytes put to remote peers
  uint64_t transfers = 0;  // puts (with or without a signal) and lone signal adds
};

class RemoteProxy {
 public:
  // regions[r], signals[r]: rank r's region and signal array (slot s at signals[r] +
  // s * signal_stride words); regions[rank] is the source of every put.
  // by_hand: no proxy thread; deliver_one() delivers (tests that step the network themselves).
  RemoteProxy(int rank, std::vector<std::byte*> regions, std::vector<uint64_t*> signals,
              size_t signal_stride, int signal_slots, bool by_hand = false);
  ~RemoteProxy();
  RemoteProxy(const RemoteProxy&) = delete;
  RemoteProxy& operator=(const RemoteProxy&) = delete;

  void put(int peer, size_t dst_offset, size_t src_offset, size_t bytes, int slot);
  void signal_add(int peer, int slot);
  // Until every op issued before has been delivered (bounded by the memory's timeout).
  void flush();
  RemoteCounters counters() const;
  // One op, as the proxy thread would pick it; false if nothing is queued.
  bool deliver_one();
  // The first error a delivery raised (a peer's group failed), or "".
  std::string error() const;

 private:
  struct Op {
    uint64_t serial;
    int slot;  // -1: a put without a signal
    size_t dst_offset, src_offset, bytes;  // bytes == 0 and src_offset == SIZE_MAX: a lone signal
  };
  void run();
  bool deliver_one(std::unique_lock<std::mutex>& lock);

  int rank_;
  std::vector<std::byte*> regions_;
  std::vector<uint64_t*> signals_;
  size_t signal_stride_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::deque<Op>> queues_;           // per destination peer
  std::vector<std::vector<uint64_t>> added_;     // [peer][slot]: adds delivered so far
  std::set<uint64_t> pending_;                   // serials not delivered yet
  uint64_t next_serial_ = 0;
  uint64_t random_ = 0x9E3779B97F4A7C15ull;
  RemoteCounters counters_;
  std::string error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace pmoe::emu
