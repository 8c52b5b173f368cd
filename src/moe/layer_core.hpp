// What every MoE layer's front end holds and does the same way: its config, token bound, device
// and backend, the checks of a forward's tensors before the backend runs, and the last forward's
// stats. SimpleMoe, TpMoe and EpMoe each keep one (their pimpl), so that their public methods
// forward to one place.
#pragma once

#include <memory>

#include "backends/moe_backend.hpp"
#include "moe/layer_args.hpp"

namespace pmoe::detail {

struct LayerCore {
  // `config` has passed the layer's checks (and, for TP and EP, the ranks' agreement); the
  // layer's Impl makes the backend in its constructor's body, after them.
  LayerCore(const MoeConfig& config, int max_tokens, Device device)
      : config(config), max_tokens(max_tokens), device(device) {}

  // `op` names the call in errors ("EpMoe::forward").
  void forward(const char* op, const Tensor& x, const Tensor& y) {
    check_forward(op, config, max_tokens, x, y, device);
    stats = MoeStats();
    backend->forward(x, y, stats);
  }
  const MoeStats& last_stats() {
    backend->finish_stats(stats);
    return stats;
  }

  MoeConfig config;
  int max_tokens;
  Device device;
  std::unique_ptr<MoeBackend> backend;
  MoeStats stats;
};

}  // namespace pmoe::detail
