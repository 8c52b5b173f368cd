// Streams and launches of the emulated CUDA runtime: stream order, the legacy streams, host
// waits on a stream or a device, and kernel launches on the device's hardware queues. The objects
// behind the handles: stream_objects.hpp; events: events.cpp; capture and graphs: graphs.cpp;
// devices and errors: devices.cpp.
//
// A stream is an in-order queue of closures run by its own host thread. The legacy stream of a
// device is one more such queue (created on first use, never destroyed); non-blocking streams do
// not wait for it, as on CUDA.
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/emulator/grid.hpp"
#include "cuda/emulator/host_view.hpp"
#include "cuda/emulator/schedule.hpp"
#include "cuda/emulator/stream_objects.hpp"

namespace pmoe::emu {

using namespace cuda_api;

thread_local StreamImpl* running_stream = nullptr;

// Live streams, for handle checks and device-wide waits. Shared ownership: a device-wide wait
// keeps a stream alive while another thread destroys it.
std::mutex registry_mutex;
std::map<StreamImpl*, std::shared_ptr<StreamImpl>>& live_streams() {
  static auto* s = new std::map<StreamImpl*, std::shared_ptr<StreamImpl>>;
  return *s;
}

namespace {

std::map<int, StreamImpl*>& legacy_streams() {
  static auto* m = new std::map<int, StreamImpl*>;
  return *m;
}

}  // namespace

bool is_legacy(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

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

std::pair<std::shared_ptr<CaptureImpl>, int> capture_of(StreamImpl* stream) {
  std::lock_guard lock(stream->mutex);
  return {stream->capture, stream->branch};
}

namespace {
thread_local uint64_t stream_work = 0;
}  // namespace

thread_local uint64_t host_syncs = 0;

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

}  // namespace cuda_api
}  // namespace pmoe::emu
