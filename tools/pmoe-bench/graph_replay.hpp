// A rank's work on its stream captured once into a CUDA graph and replayed, on the GPU or on the
// emulated device, whichever runtime this process chose (pmoe::cuda_emulated()). pmoe-bench times
// the replays with events around each one, so a time is the kernels' own, without the host's
// launches: what a caller that captures dispatch and combine (DESIGN.md: they make no host
// synchronisation and read m from device memory) pays per call.
#pragma once

#include <functional>
#include <memory>

#include "pmoe/stream.hpp"

namespace pmoe::bench {

class GraphReplay {
 public:
  // Captures what `work` enqueues on `stream` (thread-local capture mode: other ranks' threads
  // keep launching). Throws pmoe::Error naming the CUDA call that failed, or where the build has
  // no runtime of the kind chosen.
  GraphReplay(Stream stream, const std::function<void()>& work);
  ~GraphReplay();
  GraphReplay(const GraphReplay&) = delete;
  GraphReplay& operator=(const GraphReplay&) = delete;
  void replay();  // enqueues one replay on the stream it was captured on

  // One runtime's calls (graph_replay_emulated.cpp, graph_replay_gpu.cu).
  struct Calls {
    void* (*capture)(void* stream, const std::function<void()>& work);  // returns the exec
    void (*launch)(void* exec, void* stream);
    void (*destroy)(void* exec);  // never throws
  };

 private:
  const Calls* calls_;
  void* stream_;
  void* exec_;
};

}  // namespace pmoe::bench
