// The emulated device's remote path (one RemoteProxy per rank and op), held to what NCCL 2.28's
// nccl_device/gin.h writes down and no more. Kernels' puts and signal adds are queued, and a proxy
// thread that stands for the network carries them out later, in a seeded random order, through
// pointers this machine maps (thread ranks share the process; MPI processes of one machine map
// each other's regions), which the kernels themselves are denied (src/comm/node_split.hpp):
//
//   kernel thread --put/signal--> in flight: put put SIG put ...   (one GIN context per peer)
//   proxy thread, one random step at a time:
//     read a put's source      any put whose source nobody has read yet
//     land a put               any put whose source was read: its bytes into the peer's region
//     add a signal             once every put issued before it to that peer has landed; then a
//                              pause, so that what the signal does not cover is still on its way
//
// The rules, each one gin.h's sentence (docs/emulated-device.md, "The remote path"):
// - flush(coop) reads the sources of the puts that coop issued before it, and no others' ("All
//   source buffers from put's from any thread in this coop will be safe to reuse"); it waits for
//   no landing ("Flush does not guarantee that data has settled in remote memory"). A put's source
//   is otherwise read at any later step, so a kernel that rewrites it unflushed sends new bytes.
// - a signal is an atomic add into GIN's own signal word (kGinSignalWord of the slot's cache line,
//   never pmoe's word 0), which starts at a seeded non-zero value (start_gin_signals): kernels
//   read it only through readSignal and count from a baseline they read first.
// - a signal is seen only after the puts issued before it on that context to that peer have
//   landed; everything else is reordered: later puts overtake it, and puts to one peer each other.
//
// Counters: remote bytes and transfers this rank sent.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace pmoe::emu {

struct RemoteCounters {
  uint64_t bytes = 0;      // payload bytes put to remote peers
  uint64_t transfers = 0;  // puts (with or without a signal) and lone signal adds
};

// GIN's word in each signal slot's cache line (pmoe's own, which direct peers store, is word 0).
constexpr size_t kGinSignalWord = 1;

// Who issued a put, for flush: pmoe's calls use ncclCoopThread, so one kernel thread (its state
// and block; outside a kernel, the host: state null).
struct Coop {
  const void* thread = nullptr;
  unsigned block_x = 0, block_y = 0, block_z = 0;
  auto operator<=>(const Coop&) const = default;
};
// The calling kernel thread's coop.
Coop calling_coop();

// The value GIN's signal `slot` of `rank` starts at: non-zero, seeded by PMOE_EMU_SCHEDULE's seed.
uint64_t gin_signal_start(int rank, int slot);
// Writes those starting values into a rank's own GIN words (before any peer can add to them).
void start_gin_signals(uint64_t* signals, size_t signal_stride, int slots, int rank);

class RemoteProxy {
 public:
  // regions[r], signals[r]: rank r's region and signal array (slot s at signals[r] +
  // s * signal_stride words, GIN's word kGinSignalWord after it); regions[rank] is the source of
  // every put. seed: the delivery order's (with the rank). by_hand: no proxy thread; step()
  // carries out the steps (tests that drive the network themselves).
  RemoteProxy(int rank, std::vector<std::byte*> regions, std::vector<uint64_t*> signals,
              size_t signal_stride, uint64_t seed, bool by_hand = false);
  ~RemoteProxy();
  RemoteProxy(const RemoteProxy&) = delete;
  RemoteProxy& operator=(const RemoteProxy&) = delete;

  // slot >= 0: then the peer's GIN signal `slot` += 1, ordered as a lone signal_add after it.
  void put(int peer, size_t dst_offset, size_t src_offset, size_t bytes, int slot, Coop coop);
  void signal_add(int peer, int slot);
  // Reads now the sources of the puts `coop` issued before; nothing else.
  void flush(Coop coop);
  RemoteCounters counters() const;
  // One step, as the proxy thread would pick it; false if nothing is in flight.
  bool step();
  // Puts whose source nobody has read yet.
  size_t unread_puts() const;

 private:
  struct Op {
    bool is_signal;  // a signal add to `slot`, or a put
    int peer, slot;
    size_t dst_offset, src_offset, bytes;
    Coop coop;
    bool read = false;
    std::vector<std::byte> payload;  // the source, once read
  };
  void run();
  bool step(std::unique_lock<std::mutex>& lock);
  void read_source(Op& op);
  uint64_t next_random();

  int rank_;
  std::vector<std::byte*> regions_;
  std::vector<uint64_t*> signals_;
  size_t signal_stride_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<uint64_t, Op> in_flight_;           // by serial (issue order)
  std::vector<std::set<uint64_t>> puts_to_;    // [peer]: serials of puts not landed yet
  uint64_t next_serial_ = 0;
  uint64_t random_;
  RemoteCounters counters_;
  bool last_was_signal_ = false;  // the step just taken added a signal (run() pauses after it)
  bool stop_ = false;
  std::thread thread_;
};

// Tests: while held, no proxy of this process takes a step (flush still reads its sources), so
// a test can look at what a kernel left in flight; and how many puts of every proxy of this
// process still wait for their source to be read.
void hold_remote_network(bool held);
size_t unread_remote_puts();

}  // namespace pmoe::emu
