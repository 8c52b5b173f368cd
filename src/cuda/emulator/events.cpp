// Events of the emulated CUDA runtime: records and waits in stream order, host waits on them, and
// their times. An event recorded on a capturing stream is a point of that capture instead, and a
// stream that waits on it joins the capture (graphs.cpp states the rules).
#include <chrono>
#include <memory>
#include <mutex>
#include <utility>

#include "cuda/emulator/host_view.hpp"
#include "cuda/emulator/stream_objects.hpp"

namespace pmoe::emu {

using namespace cuda_api;

namespace {

// The event's capture, if its last record was captured in one still under way.
std::pair<std::shared_ptr<CaptureImpl>, int> captured_record(EventImpl* event) {
  std::lock_guard lock(event->mutex);
  if (!event->capture) return {nullptr, -1};
  std::lock_guard capture_lock(event->capture->mutex);
  if (!event->capture->active) return {nullptr, -1};
  return {event->capture, event->capture_event};
}

}  // namespace

namespace cuda_api {

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

}  // namespace cuda_api
}  // namespace pmoe::emu
