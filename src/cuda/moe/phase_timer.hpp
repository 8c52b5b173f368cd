// A device layer's phase times for MoeStats, from events in stream order (the CPU layers time
// their phases with a clock; a device forward only enqueues, so its phases are timed where they
// run). forward() brackets each phase's work with begin() / end() on the stream that runs it;
// finish(), from last_stats(), waits for the last bracket and adds each bracket's time to its
// MoeStats field, so a phase run in pieces (EpMoe's dispatch send and recv) sums them, as on the
// CPU. A phase that runs on a second stream beside another (EpMoe's experts with two
// micro-batches) overlaps it, so the phases can add up to more than the forward.
//
// Events are made at construction, none per call; a forward captured in a CUDA graph is not
// timed (its events belong to the graph). A timer made disabled (a layer without
// MoeConfig::device_stats) makes no events and records nothing: its phases stay 0.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "cuda/check.hpp"
#include "cuda/flavor.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

class PhaseTimer {
 public:
  using Phase = double MoeStats::*;

  PhaseTimer(int max_brackets, bool enabled)
      : brackets_(enabled ? size_t(max_brackets) : 0), enabled_(enabled) {
    for (Bracket& b : brackets_) {
      PMOE_CUDA_CHECK(cudaEventCreate(&b.start));
      PMOE_CUDA_CHECK(cudaEventCreate(&b.stop));
    }
  }
  ~PhaseTimer() {
    for (Bracket& b : brackets_) {
      (void)cudaEventDestroy(b.start);
      (void)cudaEventDestroy(b.stop);
    }
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  // A forward begins on `stream` (its first stream): time it unless it is being captured.
  void start(cudaStream_t stream) {
    used_ = 0;
    open_ = false;
    timing_ = false;
    if (!enabled_) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    PMOE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    timing_ = capture == cudaStreamCaptureStatusNone;
  }
  void begin(Phase phase, cudaStream_t stream) {
    if (!timing_) return;
    PMOE_CHECK(!open_ && used_ < brackets_.size(), "PhaseTimer: bracket ", used_,
               " opened with one open or past the ", brackets_.size(), " made");
    brackets_[used_].phase = phase;
    PMOE_CUDA_CHECK(cudaEventRecord(brackets_[used_].start, stream));
    open_ = true;
  }
  void end(cudaStream_t stream) {
    if (!timing_) return;
    PMOE_CUDA_CHECK(cudaEventRecord(brackets_[used_++].stop, stream));
    open_ = false;
  }
  // Adds the last timed forward's brackets to `stats` (seconds), once; waits for them.
  void finish(MoeStats& stats) {
    if (!timing_) return;
    timing_ = false;
    for (size_t i = 0; i < used_; ++i) {
      PMOE_CUDA_CHECK(cudaEventSynchronize(brackets_[i].stop));
      float ms = 0;
      PMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, brackets_[i].start, brackets_[i].stop));
      stats.*(brackets_[i].phase) += 1e-3 * ms;
    }
  }

 private:
  struct Bracket {
    Phase phase = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
  };
  std::vector<Bracket> brackets_;
  size_t used_ = 0;
  bool enabled_, timing_ = false, open_ = false;
};

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
