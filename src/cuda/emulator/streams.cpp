// Streams, events, graphs, launches, devices and errors of the emulated CUDA runtime.
//
// A stream is an in-order queue of closures run by its own host thread. The legacy stream of a
// device is one more such queue (created on first use, never destroyed); non-blocking streams do
// not wait for it, as on CUDA.
//
// Graph capture follows CUDA's cross-stream rules. A capture begins on its origin stream; an
// event recorded on a capturing stream is a point of the capture, and another stream that waits
// on it joins the capture as a new branch (a stream already in another capture may not: that is
// an isolation error, as is waiting on an event recorded outside the capture). The capture ends
// on the origin only once every other branch's last work has been waited on (directly or through
// other branches) by the origin; else cudaErrorStreamCaptureUnjoined, and the capture is gone.
//
//   capture order:   origin: A  rec(e1)  B  wait(e2)  C        a graph node: (branch, work |
//                    side:          wait(e1) X rec(e2)           record event k | wait event k)
//
// A graph keeps its nodes in capture order, which is a topological order of the dependencies.
// Its launch enqueues them in that order: branch 0 on the launch stream, branch i on the
// executable's own stream i (made at instantiation, on the hardware queue of the stream captured
// as branch i), records and waits on the executable's own events, so a launch runs its branches
// concurrently and in order with what the launch stream holds before and after it.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/emulator/grid.hpp"
#include "cuda/emulator/host_view.hpp"
#include "cuda/emulator/schedule.hpp"
#include "cuda/emulator/streams.hpp"

namespace pmoe::emu {

using namespace cuda_api;

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
namespace {
thread_local StreamImpl* running_stream = nullptr;  // the stream whose work this thread runs
}

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

namespace {

thread_local int this_device = 0;
thread_local cudaError_t last_error = cudaSuccess;
thread_local int captures_on_this_thread = 0;

// Live streams, for handle checks and device-wide waits. Shared ownership: a device-wide wait
// keeps a stream alive while another thread destroys it.
std::mutex registry_mutex;
std::map<StreamImpl*, std::shared_ptr<StreamImpl>>& live_streams() {
  static auto* s = new std::map<StreamImpl*, std::shared_ptr<StreamImpl>>;
  return *s;
}
std::map<int, StreamImpl*>& legacy_streams() {
  static auto* m = new std::map<int, StreamImpl*>;
  return *m;
}

bool is_legacy(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

// The stream a handle names, or null for a handle that is not a live stream.
StreamImpl* resolve(cudaStream_t s) {
  std::lock_guard lock(registry_mutex);
  if (is_legacy(s)) {
    StreamImpl*& legacy = legacy_streams()[this_device];
    if (!legacy) {
      auto owned = std::make_shared<StreamImpl>(this_device);  // lives as long as the process
      legacy = owned.get();
      live_streams().emplace(legacy, std::move(owned));
    }
    return legacy;
  }
  return live_streams().count(s) ? s : nullptr;  // lives while its owner can still use it
}

}  // namespace

int current_device() { return this_device; }

cudaError_t note_error(cudaError_t error) {
  if (error != cudaSuccess) last_error = error;
  return error;
}

namespace {

// The capture `stream` takes part in (null if none) and its branch there.
std::pair<std::shared_ptr<CaptureImpl>, int> capture_of(StreamImpl* stream) {
  std::lock_guard lock(stream->mutex);
  return {stream->capture, stream->branch};
}

}  // namespace

namespace {
thread_local uint64_t stream_work = 0, host_syncs = 0;
}  // namespace

uint64_t stream_work_by_this_thread() { return stream_work; }
uint64_t host_syncs_by_this_thread() { return host_syncs; }

cudaError_t enqueue(cudaStream_t handle, std::function<void()> work) {
  if (is_legacy(handle) && captures_on_this_thread > 0) return cudaErrorStreamCaptureImplicit;
  StreamImpl* stream = resolve(handle);
  if (!stream) return cudaErrorInvalidResourceHandle;
  ++stream_work;
  if (auto [capture, branch] = capture_of(stream); capture) {
    std::lock_guard lock(capture->mutex);
    if (capture->invalidated) return cudaErrorStreamCaptureInvalidated;
    GraphNode node;
    node.run = std::move(work);
    capture->add(branch, std::move(node));
    return cudaSuccess;
  }
  stream->push(std::move(work));
  return cudaSuccess;
}

namespace {

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

// Ends a stream's worker once it has run what was enqueued, and forgets the stream.
void retire_stream(std::shared_ptr<StreamImpl> stream) {
  {
    std::lock_guard lock(registry_mutex);
    live_streams().erase(stream.get());
  }
  {
    std::lock_guard lock(stream->mutex);
    stream->stopping = true;  // the worker finishes what was enqueued, then returns
    stream->changed.notify_all();
  }
  stream->worker.join();
}

// The event's capture, if its last record was captured in one still under way.
std::pair<std::shared_ptr<CaptureImpl>, int> captured_record(EventImpl* event) {
  std::lock_guard lock(event->mutex);
  if (!event->capture) return {nullptr, -1};
  std::lock_guard capture_lock(event->capture->mutex);
  if (!event->capture->active) return {nullptr, -1};
  return {event->capture, event->capture_event};
}

}  // namespace

GraphImpl::~GraphImpl() {
  for (auto& stream : streams) retire_stream(stream);
}

cudaError_t wait_stream(cudaStream_t handle) {
  StreamImpl* stream = resolve(handle);
  if (!stream) return cudaErrorInvalidResourceHandle;
  {
    std::lock_guard lock(stream->mutex);
    if (stream->capture) return cudaErrorStreamCaptureUnsupported;
  }
  if (is_legacy(handle) && captures_on_this_thread > 0) return cudaErrorStreamCaptureImplicit;
  stream->wait_for(stream->enqueued());
  host_view_synchronized();
  return stream->take_sticky();
}

void wait_device(int device) {
  std::vector<std::pair<std::shared_ptr<StreamImpl>, uint64_t>> targets;
  {
    std::lock_guard lock(registry_mutex);
    for (const auto& [handle, stream] : live_streams())
      if (stream->device == device) targets.emplace_back(stream, stream->enqueued());
  }
  for (const auto& [stream, target] : targets) stream->wait_for(target);
  host_view_synchronized();
}

namespace {
thread_local uint64_t kernels_launched = 0;
}  // namespace

uint64_t kernels_launched_by_this_thread() { return kernels_launched; }

cudaError_t launch(dim3 grid, dim3 block, size_t, cudaStream_t handle, std::function<void()> body,
                   const char* name) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (uint64_t(grid.x) * grid.y * grid.z == 0 || threads == 0 || threads > 1024)
    return note_error(cudaErrorInvalidConfiguration);
  StreamImpl* stream = resolve(handle);
  if (!stream) return note_error(cudaErrorInvalidResourceHandle);
  const uint64_t number = ++kernels_launched;
  const int device = stream->device;
  return note_error(enqueue(handle, [device, grid, block, number, name, body = std::move(body)] {
    before_kernel_starts();
    std::lock_guard held(HardwareQueues::of(device).queue(running_stream->hardware_queue));
    const cudaError_t status = run_grid(device, grid, block, body, number, name);
    if (status != cudaSuccess) running_stream->fail(status);
  }));
}

namespace cuda_api {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_shape().devices;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_shape().devices) return note_error(cudaErrorInvalidDevice);
  this_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = this_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  if (captures_on_this_thread > 0) return note_error(cudaErrorStreamCaptureUnsupported);
  ++host_syncs;
  wait_device(this_device);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= device_shape().devices) return note_error(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = device_shape().sms; return cudaSuccess;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = device_shape().blocks_per_sm; return cudaSuccess;
  }
  return note_error(cudaErrorInvalidValue);
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*, int block_threads,
                                                          size_t) {
  if (block_threads <= 0 || block_threads > 1024) return note_error(cudaErrorInvalidValue);
  *blocks = device_shape().blocks_per_sm;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() { return std::exchange(last_error, cudaSuccess); }
cudaError_t cudaPeekAtLastError() { return last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorUnknown: return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorStreamCaptureUnmatched: return "the capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined: return "the capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorUnknown: return "unknown error";
  }
  return "unknown error";
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  auto s = std::make_shared<StreamImpl>(this_device);
  std::lock_guard lock(registry_mutex);
  *stream = s.get();
  live_streams().emplace(s.get(), std::move(s));
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t handle) {
  if (is_legacy(handle)) return note_error(cudaErrorInvalidResourceHandle);
  std::shared_ptr<StreamImpl> stream;
  {
    std::lock_guard lock(registry_mutex);
    auto it = live_streams().find(handle);
    if (it == live_streams().end()) return note_error(cudaErrorInvalidResourceHandle);
    stream = it->second;
  }
  retire_stream(std::move(stream));
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  ++host_syncs;
  return note_error(wait_stream(stream));
}

cudaError_t cudaStreamQuery(cudaStream_t handle) {
  StreamImpl* stream = resolve(handle);
  if (!stream) return note_error(cudaErrorInvalidResourceHandle);
  std::lock_guard lock(stream->mutex);
  if (stream->completed != stream->submitted) return cudaErrorNotReady;
  host_view_synchronized();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  *event = new EventImpl;
  (*event)->timing = (flags & cudaEventDisableTiming) == 0;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event) return note_error(cudaErrorInvalidResourceHandle);
  delete event;  // an event still pending in a stream is the caller's error, as on CUDA
  return cudaSuccess;
}

// On a capturing stream: a point of the capture (a record node), which a wait joins.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event) return note_error(cudaErrorInvalidResourceHandle);
  if (!is_legacy(stream)) {
    StreamImpl* s = resolve(stream);
    if (!s) return note_error(cudaErrorInvalidResourceHandle);
    if (auto [capture, branch] = capture_of(s); capture) {
      int number;
      {
        std::lock_guard lock(capture->mutex);
        if (capture->invalidated) return note_error(cudaErrorStreamCaptureInvalidated);
        number = capture->graph->events++;
        GraphNode node;
        node.kind = GraphNode::record;
        node.event = number;
        capture->add(branch, std::move(node));
        capture->records.push_back({branch, capture->lengths[size_t(branch)]});
      }
      std::lock_guard event_lock(event->mutex);  // not under the capture's: captured_record()
      event->capture = capture;                  // takes the event's mutex first
      event->capture_event = number;
      return cudaSuccess;
    }
  }
  {
    std::lock_guard lock(event->mutex);
    event->capture.reset();
  }
  return note_error(enqueue_record(stream, event));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!event) return note_error(cudaErrorInvalidResourceHandle);
  if (captured_record(event).first) return note_error(cudaErrorCapturedEvent);
  ++host_syncs;
  std::unique_lock lock(event->mutex);
  const uint64_t target = event->recorded;
  event->changed.wait(lock, [&] { return event->completed >= target; });
  host_view_synchronized();
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!event) return note_error(cudaErrorInvalidResourceHandle);
  if (captured_record(event).first) return note_error(cudaErrorCapturedEvent);
  std::lock_guard lock(event->mutex);
  if (event->completed < event->recorded) return cudaErrorNotReady;
  host_view_synchronized();
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end) return note_error(cudaErrorInvalidResourceHandle);
  std::scoped_lock lock(start->mutex, end->mutex);
  if (!start->timing || !end->timing || start->recorded == 0 || end->recorded == 0)
    return note_error(cudaErrorInvalidResourceHandle);
  if (start->completed < start->recorded || end->completed < end->recorded) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}

// A wait on an event recorded in a capture: a wait node of that capture; a stream not capturing
// joins the capture with it. A capturing stream may wait only on events of its own capture.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  if (!event) return note_error(cudaErrorInvalidResourceHandle);
  StreamImpl* s = is_legacy(stream) ? nullptr : resolve(stream);
  if (!is_legacy(stream) && !s) return note_error(cudaErrorInvalidResourceHandle);
  auto [stream_capture, branch] =
      s ? capture_of(s) : std::pair<std::shared_ptr<CaptureImpl>, int>{nullptr, 0};
  auto [event_capture, event_number] = captured_record(event);
  if (event_capture) {
    if (!s) return note_error(cudaErrorStreamCaptureImplicit);
    if (stream_capture && stream_capture != event_capture) {
      std::lock_guard lock(stream_capture->mutex);
      stream_capture->invalidated = true;
      return note_error(cudaErrorStreamCaptureIsolation);
    }
    std::lock_guard lock(event_capture->mutex);
    if (event_capture->invalidated) return note_error(cudaErrorStreamCaptureInvalidated);
    if (!stream_capture) {  // s joins the capture as a new branch
      branch = int(event_capture->branches.size());
      event_capture->branches.push_back(s);
      event_capture->lengths.push_back(0);
      event_capture->graph->branch_queues.push_back(s->hardware_queue);
      std::lock_guard stream_lock(s->mutex);
      s->capture = event_capture;
      s->branch = branch;
    }
    GraphNode node;
    node.kind = GraphNode::wait;
    node.event = event_number;
    event_capture->add(branch, std::move(node));
    event_capture->waits.push_back({branch, event_number});
    return cudaSuccess;
  }
  if (stream_capture) {
    std::lock_guard lock(stream_capture->mutex);
    stream_capture->invalidated = true;  // an event from outside the capture
    return note_error(cudaErrorStreamCaptureIsolation);
  }
  return note_error(enqueue_wait(stream, event));
}

cudaError_t cudaStreamBeginCapture(cudaStream_t handle, cudaStreamCaptureMode) {
  if (is_legacy(handle)) return note_error(cudaErrorStreamCaptureUnsupported);
  StreamImpl* stream = resolve(handle);
  if (!stream) return note_error(cudaErrorInvalidResourceHandle);
  std::lock_guard lock(stream->mutex);
  if (stream->capture) return note_error(cudaErrorInvalidValue);
  auto capture = std::make_shared<CaptureImpl>();
  capture->branches = {stream};
  capture->lengths = {0};
  capture->graph->device = stream->device;
  capture->graph->branch_queues = {stream->hardware_queue};
  stream->capture = std::move(capture);
  stream->branch = 0;
  ++captures_on_this_thread;
  return cudaSuccess;
}

// The legacy stream never captures here (cudaStreamBeginCapture refuses it).
cudaError_t cudaStreamIsCapturing(cudaStream_t handle, cudaStreamCaptureStatus* status) {
  *status = cudaStreamCaptureStatusNone;
  if (is_legacy(handle)) return cudaSuccess;
  StreamImpl* stream = resolve(handle);
  if (!stream) return note_error(cudaErrorInvalidResourceHandle);
  const std::shared_ptr<CaptureImpl> capture = capture_of(stream).first;
  if (!capture) return cudaSuccess;
  std::lock_guard lock(capture->mutex);
  *status =
      capture->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

// Every stream of the capture leaves it, whether the graph comes out or not.
cudaError_t cudaStreamEndCapture(cudaStream_t handle, cudaGraph_t* graph) {
  StreamImpl* stream = resolve(handle);
  if (!stream) return note_error(cudaErrorInvalidResourceHandle);
  auto [capture, branch] = capture_of(stream);
  if (!capture) return note_error(cudaErrorInvalidValue);
  if (branch != 0) return note_error(cudaErrorStreamCaptureUnmatched);
  std::lock_guard lock(capture->mutex);
  for (StreamImpl* member : capture->branches) {
    std::lock_guard member_lock(member->mutex);
    member->capture.reset();
    member->branch = 0;
  }
  capture->active = false;
  --captures_on_this_thread;
  *graph = nullptr;
  if (capture->invalidated) return note_error(cudaErrorStreamCaptureInvalidated);
  for (int b = 1; b < int(capture->branches.size()); ++b)
    if (!capture->joined(b)) return note_error(cudaErrorStreamCaptureUnjoined);
  *graph = std::exchange(capture->graph, nullptr);
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return note_error(cudaErrorInvalidValue);
  auto* made = new GraphImpl;
  made->nodes = graph->nodes;
  made->device = graph->device;
  made->branch_queues = graph->branch_queues;
  made->events = graph->events;
  for (size_t b = 1; b < made->branch_queues.size(); ++b) {
    auto branch = std::make_shared<StreamImpl>(made->device, made->branch_queues[b]);
    std::lock_guard lock(registry_mutex);  // device-wide waits see it
    live_streams().emplace(branch.get(), branch);
    made->streams.push_back(std::move(branch));
  }
  for (int e = 0; e < made->events; ++e) {
    made->event_objects.push_back(std::make_shared<EventImpl>());
    made->event_objects.back()->timing = false;
  }
  *exec = made;
  return cudaSuccess;
}

// Records and waits inside one branch order nothing that stream order does not: a graph of one
// branch replays its work alone, so it can also be launched into another capture.
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (!exec) return note_error(cudaErrorInvalidValue);
  const bool branches = !exec->streams.empty();
  if (branches && !is_legacy(stream)) {
    StreamImpl* s = resolve(stream);
    if (!s) return note_error(cudaErrorInvalidResourceHandle);
    if (capture_of(s).first) return note_error(cudaErrorStreamCaptureUnsupported);
  }
  for (const GraphNode& node : exec->nodes) {
    const cudaStream_t target =
        node.branch == 0 ? stream : exec->streams[size_t(node.branch - 1)].get();
    cudaError_t status = cudaSuccess;
    if (node.kind == GraphNode::work)
      status = enqueue(target, node.run);
    else if (branches && node.kind == GraphNode::record)
      status = enqueue_record(target, exec->event_objects[size_t(node.event)]);
    else if (branches)
      status = enqueue_wait(target, exec->event_objects[size_t(node.event)]);
    if (status != cudaSuccess) return note_error(status);
  }
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;  // its streams run what they hold first; queued nodes are copies
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

}  // namespace cuda_api
}  // namespace pmoe::emu
