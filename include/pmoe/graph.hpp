// CudaGraph: the work a rank enqueues on its CUDA stream, captured once into a CUDA graph and then
// replayed, one launch for the whole of it instead of the host's launches and argument checks.
// It runs on whichever CUDA runtime this process chose (a GPU or the emulated device,
// pmoe::cuda_emulated()), and the caller needs no CUDA header.
//
// What may be captured: work that only enqueues on the stream, never waits for the device on the
// host, and fixes every pointer and shape at capture (a replay reruns the same kernels on the same
// memory: write new inputs into the captured device buffers before a replay).
//   - AllToAll::dispatch and combine on a CUDA communicator, any Phase. They make no host
//     synchronisation, and with `bound_m` (an i32 [1] tensor on the device) they read m there, on
//     the device, so each replay takes the m written into it before: capture with x, indices,
//     weights and y of max_tokens rows. Replays keep the op's order (dispatch, then combine),
//     which the kernels check: a step out of order or a combine with another m than its dispatch
//     records an error that check_errors() raises once the stream is synchronised
//     (docs/gpu-all-to-all.md, "Graph replays").
//   - AllGatherGemm::run and GemmReduceScatter::run on a CUDA device (their copy stream joins the
//     capture).
//   - SimpleMoe, TpMoe and EpMoe forward on a CUDA device: they read neither the routing nor the
//     expert counts back to the host. forward() takes no bound_m, so m is x's rows at capture,
//     and last_stats() counts nothing of a replay.
// What may not: whatever waits for the device on the host (pmoe::synchronize, pmoe::copy, a
// Buffer allocated on a device), and the CPU's ops, which do their work on the calling thread. A
// call that waits fails during the capture, and the constructor then throws.
//
// Collective ops stay collective: every rank replays its graph where it would have made the call,
// or its peers' kernels wait for it (bounded by PMOE_TIMEOUT_S).
#pragma once

#include <functional>

#include "pmoe/stream.hpp"

namespace pmoe {

class CudaGraph {
 public:
  // Runs `work`, capturing what it enqueues on `stream` (a CUDA stream such as comm.stream() of
  // run_ranks(n, fn, Device::cuda(i)); other streams that join by waiting on an event recorded in
  // it are captured too). Thread-local capture: other threads, other ranks sharing the device
  // among them, keep launching and synchronising meanwhile. Nothing runs until replay(). Throws
  // pmoe::Error for the null Stream (the CPU, or the device's legacy stream, neither of which
  // captures), in a build or process without a CUDA runtime, or naming the CUDA call that failed.
  // An exception from `work` ends the capture and propagates (a pmoe::Error as "CudaGraph:
  // capture failed: " and its message). The stream is usable after a throw.
  CudaGraph(Stream stream, const std::function<void()>& work);
  ~CudaGraph();  // a replay still running completes
  CudaGraph(CudaGraph&& other) noexcept;
  CudaGraph& operator=(CudaGraph&& other) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Enqueues one replay on the stream captured and returns; its results are ready in stream
  // order. Throws pmoe::Error naming the CUDA call that failed, or on a moved-from graph.
  void replay();
  Stream stream() const { return stream_; }

 private:
  Stream stream_;
  void* exec_ = nullptr;  // the instantiated graph (a cudaGraphExec_t); null once moved from
};

}  // namespace pmoe
