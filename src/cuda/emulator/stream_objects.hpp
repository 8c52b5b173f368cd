// The objects behind the emulated runtime's stream, event and graph handles (runtime_api.hpp's
// StreamImpl, EventImpl, GraphImpl), and the per-thread state and helpers that the files which
// implement those calls share: streams.cpp (streams, launches), events.cpp, graphs.cpp (capture
// and graphs) and devices.cpp (devices and errors). Nothing outside those files includes it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/emulator/streams.hpp"

namespace pmoe::emu {

struct GraphNode {
  enum Kind : uint8_t { work, record, wait };
  int branch = 0;
  Kind kind = work;
  std::function<void()> run;  // work
  int event = -1;             // record, wait: the graph's event number
};

struct GraphImpl {
  std::vector<GraphNode> nodes;  // capture order
  int device = 0;
  std::vector<int> branch_queues;  // hardware queue of the stream captured as each branch
  int events = 0;
  // An executable's (cudaGraphInstantiate) streams for branches 1.. and its events.
  std::vector<std::shared_ptr<StreamImpl>> streams;
  std::vector<std::shared_ptr<EventImpl>> event_objects;
  ~GraphImpl();
};

// A capture in progress (shared by the streams that joined it and the events recorded in it).
struct CaptureImpl {
  std::mutex mutex;
  bool active = true;
  bool invalidated = false;
  GraphImpl* graph = new GraphImpl;
  std::vector<StreamImpl*> branches;  // [0] the origin
  std::vector<size_t> lengths;        // nodes of each branch so far
  struct Record {
    int branch;
    size_t position;  // the branch's length right after the record
  };
  std::vector<Record> records;  // by graph event number
  struct Wait {
    int waiter, event;
  };
  std::vector<Wait> waits;
  ~CaptureImpl() { delete graph; }

  // Appends a node to `branch` (mutex held).
  void add(int branch, GraphNode node) {
    node.branch = branch;
    graph->nodes.push_back(std::move(node));
    ++lengths[size_t(branch)];
  }
  // Whether the origin waits, directly or through other branches, on branch b's last node.
  bool joined(int b, int depth = 0) const {
    if (b == 0) return true;
    if (depth > int(branches.size())) return false;
    for (const Wait& w : waits) {
      const Record& r = records[size_t(w.event)];
      if (r.branch == b && r.position == lengths[size_t(b)] && w.waiter != b &&
          joined(w.waiter, depth + 1))
        return true;
    }
    return false;
  }
};

struct StreamImpl;
// The stream whose work this thread runs (streams.cpp).
extern thread_local StreamImpl* running_stream;

// The hardware queues ("connections") of a device: CUDA_DEVICE_MAX_CONNECTIONS of them (8 when
// unset), read when the device is first used. Streams take them in turn as they are created; a
// kernel holds its stream's queue while it runs, so kernels of streams that share a queue run one
// after the other, as on a GPU.
class HardwareQueues {
 public:
  static HardwareQueues& of(int device) {
    static std::mutex mutex;
    static auto* all = new std::map<int, HardwareQueues*>;
    std::lock_guard lock(mutex);
    HardwareQueues*& q = (*all)[device];
    if (!q) q = new HardwareQueues;  // lives as long as the process
    return *q;
  }
  int next() { return int(created_++ % queues_.size()); }
  std::mutex& queue(int index) { return queues_[size_t(index)]; }

 private:
  HardwareQueues() : queues_(size_t(connections())) {}
  static int connections() {
    const char* text = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    const int value = text ? std::atoi(text) : 0;
    return value >= 1 && value <= 32 ? value : 8;
  }
  std::vector<std::mutex> queues_;
  std::atomic<uint64_t> created_{0};
};

struct StreamImpl {
  int device = 0;
  int hardware_queue = 0;
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::function<void()>> queue;
  uint64_t submitted = 0, completed = 0;
  bool stopping = false;
  cudaError_t sticky = cudaSuccess;  // an asynchronous failure, returned by the next sync
  std::shared_ptr<CaptureImpl> capture;  // set while the stream takes part in a capture
  int branch = 0;                         // its branch in that capture
  std::thread worker;

  explicit StreamImpl(int d) : StreamImpl(d, HardwareQueues::of(d).next()) {}
  StreamImpl(int d, int queue) : device(d), hardware_queue(queue), worker([this] { run(); }) {}

  void run() {
    running_stream = this;
    std::unique_lock lock(mutex);
    for (;;) {
      changed.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;
      std::function<void()> work = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      work();
      lock.lock();
      ++completed;
      changed.notify_all();
    }
  }
  void push(std::function<void()> work) {
    std::lock_guard lock(mutex);
    queue.push_back(std::move(work));
    ++submitted;
    changed.notify_all();
  }
  void wait_for(uint64_t target) {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return completed >= target; });
  }
  uint64_t enqueued() {
    std::lock_guard lock(mutex);
    return submitted;
  }
  cudaError_t take_sticky() {
    std::lock_guard lock(mutex);
    return std::exchange(sticky, cudaSuccess);
  }
  void fail(cudaError_t error) {
    std::lock_guard lock(mutex);
    if (sticky == cudaSuccess) sticky = error;
  }
};

struct EventImpl {
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t recorded = 0, completed = 0;
  std::chrono::steady_clock::time_point when{};
  bool timing = true;
  // Its last record was captured: the capture and the graph's event number for that record.
  std::shared_ptr<CaptureImpl> capture;
  int capture_event = -1;
};

extern thread_local int this_device;              // cudaSetDevice's (devices.cpp)
extern thread_local int captures_on_this_thread;  // captures begun and not ended (graphs.cpp)
extern thread_local uint64_t host_syncs;          // host_syncs_by_this_thread() (streams.cpp)

// Live streams, for handle checks and device-wide waits (streams.cpp).
extern std::mutex registry_mutex;
std::map<StreamImpl*, std::shared_ptr<StreamImpl>>& live_streams();

bool is_legacy(cudaStream_t s);
// The stream a handle names, or null for a handle that is not a live stream.
StreamImpl* resolve(cudaStream_t s);
// The capture `stream` takes part in (null if none) and its branch there.
std::pair<std::shared_ptr<CaptureImpl>, int> capture_of(StreamImpl* stream);
// Ends a stream's worker once it has run what was enqueued, and forgets the stream.
void retire_stream(std::shared_ptr<StreamImpl> stream);

// A record of `event` on `stream` (not capturing); `Ptr` keeps the event alive while queued
// (a raw pointer for the caller's events, shared for a graph executable's own).
template <typename Ptr>
cudaError_t enqueue_record(cudaStream_t stream, Ptr event) {
  uint64_t sequence;
  {
    std::lock_guard lock(event->mutex);
    sequence = ++event->recorded;
  }
  return enqueue(stream, [event, sequence] {
    std::lock_guard lock(event->mutex);
    event->when = std::chrono::steady_clock::now();
    if (event->completed < sequence) event->completed = sequence;
    event->changed.notify_all();
  });
}

// `stream` waits for the last record of `event` enqueued so far.
template <typename Ptr>
cudaError_t enqueue_wait(cudaStream_t stream, Ptr event) {
  uint64_t target;
  {
    std::lock_guard lock(event->mutex);
    target = event->recorded;
  }
  return enqueue(stream, [event, target] {
    std::unique_lock lock(event->mutex);
    event->changed.wait(lock, [&] { return event->completed >= target; });
  });
}

}  // namespace pmoe::emu
