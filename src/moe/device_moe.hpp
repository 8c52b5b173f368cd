// The boundary between the MoE layers' front ends (src/moe: validation, the public classes) and
// their device data paths (src/cuda/moe). A device layer sees arguments already checked; its
// forward() only enqueues work on its stream and returns (no host read of routing or counts),
// so the caller sees y in stream order.
#pragma once

#include <cstddef>
#include <memory>

#include "pmoe/comm.hpp"
#include "pmoe/moe.hpp"

namespace pmoe::detail {

class DeviceMoe {
 public:
  virtual ~DeviceMoe() = default;
  // x [m, H] and y [m, O] config.dtype, contiguous, on the layer's device (checked).
  virtual void forward(const Tensor& x, const Tensor& y, MoeStats& stats) = 0;
  // Completes `stats`, as forward() left them, with what the device counted for that forward
  // (last_stats() calls it): waits until the stream has got that far. Does nothing for a
  // forward captured in a graph, or a second time.
  virtual void finish_stats(MoeStats& stats) { (void)stats; }
  virtual size_t weight_bytes() const = 0;
  virtual size_t workspace_bytes() const = 0;
};

// On the device runtime this process chose (src/core/device_runtime.hpp). `config` validated.
std::unique_ptr<DeviceMoe> make_device_simple_moe(const MoeConfig& config, int max_tokens,
                                                  Device device, Stream stream);
std::unique_ptr<DeviceMoe> make_device_tp_moe(Communicator& comm, const MoeConfig& config,
                                              int max_tokens);
std::unique_ptr<DeviceMoe> make_device_ep_moe(Communicator& comm, const MoeConfig& config,
                                              int max_tokens, int micro_batches);

}  // namespace pmoe::detail
