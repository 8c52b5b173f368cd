// The boundary between the MoE layers' front ends (src/moe: validation, the public classes) and a
// backend's data path: the CPU's (src/cpu/*_moe.cpp) or a device's (src/cuda/moe). A backend sees
// a config and arguments already checked. On a device, forward() only enqueues work on the
// layer's stream and returns (no host read of routing or counts), so the caller sees y in stream
// order; on the CPU it returns with y written.
#pragma once

#include <cstddef>

#include "pmoe/moe.hpp"

namespace pmoe::detail {

class MoeBackend {
 public:
  virtual ~MoeBackend() = default;
  // x [m, H] and y [m, O] config.dtype, contiguous, on the layer's device, m <= the layer's
  // max_tokens (checked). `stats` arrive zeroed; forward() fills in what it counted.
  virtual void forward(const Tensor& x, const Tensor& y, MoeStats& stats) = 0;
  // Completes `stats`, as forward() left them, with what the device counted for that forward
  // (last_stats() calls it): waits until the stream has got that far. Does nothing for a
  // forward captured in a graph, or a second time, or on the CPU.
  virtual void finish_stats(MoeStats& stats) { (void)stats; }
  virtual size_t weight_bytes() const = 0;
  virtual size_t workspace_bytes() const = 0;
};

}  // namespace pmoe::detail
