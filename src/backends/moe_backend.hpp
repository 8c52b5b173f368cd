// The boundary between the MoE layers' front ends (src/moe: validation, the public classes) and a
// backend's data path: the CPU's (src/cpu/*_moe.cpp) or a device's (src/cuda/moe). A backend sees
// a config and arguments already checked. On a device, forward() only enqueues work on the
// layer's stream and returns (no host read of routing or counts), so the caller sees y in stream
// order; on the CPU it returns with y written.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "pmoe/all_to_all.hpp"
#include "pmoe/error.hpp"
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
  // EpMoe's: runs `change` (a mask_rank, unmask_rank or rejoin) on every exchange of the layer,
  // and the first exchange, whose mask and routing every exchange shares.
  virtual void change_membership(const std::function<void(AllToAll&)>& change) {
    (void)change;
    throw Error("this layer has no exchange whose ranks could change");
  }
  virtual const AllToAll& exchange() const { throw Error("this layer has no exchange"); }
};

// The exchange an EpMoe layer of `config` runs: its slots, top-k, wire width and dtype, and
// options' placement and mask; in_place for the device's in-place buffers.
AllToAllConfig ep_exchange_config(const MoeConfig& config, const EpMoeOptions& options,
                                  int tokens_per_batch, int wire_dim, bool in_place);

}  // namespace pmoe::detail
