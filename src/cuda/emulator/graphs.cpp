// Graph capture and graphs of the emulated CUDA runtime: a capture records the work of the
// streams that take part in it, a graph executable replays it.
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
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/emulator/stream_objects.hpp"

namespace pmoe::emu {

using namespace cuda_api;

thread_local int captures_on_this_thread = 0;

GraphImpl::~GraphImpl() {
  for (auto& stream : streams) retire_stream(stream);
}

namespace cuda_api {

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
