// Streams, events, graphs, launches, devices and errors of the emulated CUDA runtime.
//
// A stream is an in-order queue of closures run by its own host thread. The legacy stream of a
// device is one more such queue (created on first use, never destroyed); non-blocking streams do
// not wait for it, as on CUDA. A capture swaps the stream's queue for a graph's node list; a graph
// launch enqueues the nodes in capture order.
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
#include "cuda/emulator/schedule.hpp"
#include "cuda/emulator/streams.hpp"

namespace pmoe::emu {

using namespace cuda_api;

struct GraphImpl {
  std::vector<std::function<void()>> nodes;  // one stream's work, in capture order
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
  GraphImpl* capture = nullptr;      // set while the stream is being captured
  std::thread worker;

  explicit StreamImpl(int d)
      : device(d), hardware_queue(HardwareQueues::of(d).next()), worker([this] { run(); }) {}

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

cudaError_t enqueue(cudaStream_t handle, std::function<void()> work) {
  if (is_legacy(handle) && captures_on_this_thread > 0) return cudaErrorStreamCaptureImplicit;
  StreamImpl* stream = resolve(handle);
  if (!stream) return cudaErrorInvalidResourceHandle;
  {
    std::lock_guard lock(stream->mutex);
    if (stream->capture) {
      stream->capture->nodes.push_back(std::move(work));
      return cudaSuccess;
    }
  }
  stream->push(std::move(work));
  return cudaSuccess;
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
}

namespace {
thread_local uint64_t kernels_launched = 0;
}  // namespace

uint64_t kernels_launched_by_this_thread() { return kernels_launched; }

cudaError_t launch(dim3 grid, dim3 block, size_t, cudaStream_t handle, std::function<void()> body) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (uint64_t(grid.x) * grid.y * grid.z == 0 || threads == 0 || threads > 1024)
    return note_error(cudaErrorInvalidConfiguration);
  StreamImpl* stream = resolve(handle);
  if (!stream) return note_error(cudaErrorInvalidResourceHandle);
  const uint64_t number = ++kernels_launched;
  const int device = stream->device;
  return note_error(enqueue(handle, [device, grid, block, number, body = std::move(body)] {
    before_kernel_starts();
    std::lock_guard held(HardwareQueues::of(device).queue(running_stream->hardware_queue));
    const cudaError_t status = run_grid(device, grid, block, body, number);
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
    stream = std::move(it->second);
    live_streams().erase(it);
  }
  {
    std::lock_guard lock(stream->mutex);
    stream->stopping = true;  // the worker finishes what was enqueued, then returns
    stream->changed.notify_all();
  }
  stream->worker.join();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) { return note_error(wait_stream(stream)); }

cudaError_t cudaStreamQuery(cudaStream_t handle) {
  StreamImpl* stream = resolve(handle);
  if (!stream) return note_error(cudaErrorInvalidResourceHandle);
  std::lock_guard lock(stream->mutex);
  return stream->completed == stream->submitted ? cudaSuccess : cudaErrorNotReady;
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

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event) return note_error(cudaErrorInvalidResourceHandle);
  uint64_t sequence;
  {
    std::lock_guard lock(event->mutex);
    sequence = ++event->recorded;
  }
  return note_error(enqueue(stream, [event, sequence] {
    std::lock_guard lock(event->mutex);
    event->when = std::chrono::steady_clock::now();
    if (event->completed < sequence) event->completed = sequence;
    event->changed.notify_all();
  }));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!event) return note_error(cudaErrorInvalidResourceHandle);
  std::unique_lock lock(event->mutex);
  const uint64_t target = event->recorded;
  event->changed.wait(lock, [&] { return event->completed >= target; });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!event) return note_error(cudaErrorInvalidResourceHandle);
  std::lock_guard lock(event->mutex);
  return event->completed >= event->recorded ? cudaSuccess : cudaErrorNotReady;
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

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  if (!event) return note_error(cudaErrorInvalidResourceHandle);
  uint64_t target;
  {
    std::lock_guard lock(event->mutex);
    target = event->recorded;
  }
  return note_error(enqueue(stream, [event, target] {
    std::unique_lock lock(event->mutex);
    event->changed.wait(lock, [&] { return event->completed >= target; });
  }));
}

cudaError_t cudaStreamBeginCapture(cudaStream_t handle, cudaStreamCaptureMode) {
  if (is_legacy(handle)) return note_error(cudaErrorStreamCaptureUnsupported);
  StreamImpl* stream = resolve(handle);
  if (!stream) return note_error(cudaErrorInvalidResourceHandle);
  std::lock_guard lock(stream->mutex);
  if (stream->capture) return note_error(cudaErrorInvalidValue);
  stream->capture = new GraphImpl;
  ++captures_on_this_thread;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t handle, cudaGraph_t* graph) {
  StreamImpl* stream = resolve(handle);
  if (!stream) return note_error(cudaErrorInvalidResourceHandle);
  std::lock_guard lock(stream->mutex);
  if (!stream->capture) return note_error(cudaErrorInvalidValue);
  *graph = std::exchange(stream->capture, nullptr);
  --captures_on_this_thread;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (!graph) return note_error(cudaErrorInvalidValue);
  *exec = new GraphImpl(*graph);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (!exec) return note_error(cudaErrorInvalidValue);
  for (const auto& node : exec->nodes) {
    const cudaError_t status = enqueue(stream, node);
    if (status != cudaSuccess) return note_error(status);
  }
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;  // queued nodes are copies: a replay in flight keeps running
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

}  // namespace cuda_api
}  // namespace pmoe::emu
