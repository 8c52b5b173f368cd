// TpMoe's front end: every expert's hidden columns split across the ranks, tokens replicated. It
// checks that every rank has the same config and validates every call's tensors; the backend for
// the communicator's device (src/backends/registry.hpp) does the work: the CPU's
// (src/cpu/tp_moe.cpp) or a device's (src/cuda/moe/tp_moe.cu).
#include "backends/registry.hpp"
#include "moe/layer_core.hpp"

namespace pmoe {

namespace {

// This rank's own checks.
void check_config(const MoeConfig& config, int world_size, int max_tokens) {
  config.validate();
  detail::check_max_tokens("TpMoe", "max_tokens", max_tokens);
  PMOE_CHECK(config.ffn_dim % world_size == 0, "TpMoe: ffn_dim = ", config.ffn_dim,
             " is not divisible by the ", world_size,
             " ranks; TP gives every rank the same slice of each expert's hidden columns: make "
             "ffn_dim a multiple of ",
             world_size, " (e.g. ", (config.ffn_dim / world_size + 1) * world_size,
             ") or change the number of ranks");
}

MoeConfig validated(Communicator& comm, const MoeConfig& config, int max_tokens) {
  const MoeConfig current = config.with_current_names();
  detail::agree_on_layer(
      comm, "TpMoe", current,
      [&](detail::ConfigAgreement& agree) { agree.field("max_tokens", max_tokens); },
      [&] { check_config(config, comm.size(), max_tokens); });
  return current;
}

}  // namespace

struct TpMoe::Impl : detail::LayerCore {
  Impl(Communicator& comm, const MoeConfig& config, int max_tokens)
      : LayerCore(validated(comm, config, max_tokens), max_tokens, comm.device()) {
    backend = detail::backends(device).make_tp_moe(comm, LayerCore::config, max_tokens);
  }
};

TpMoe::TpMoe(Communicator& comm, const MoeConfig& config, int max_tokens)
    : impl_(std::make_unique<Impl>(comm, config, max_tokens)) {}

TpMoe::~TpMoe() = default;

void TpMoe::forward(const Tensor& x, const Tensor& y) {
  impl_->forward("TpMoe::forward", x, y);
}

const MoeConfig& TpMoe::config() const { return impl_->config; }
size_t TpMoe::weight_bytes() const { return impl_->backend->weight_bytes(); }
size_t TpMoe::workspace_bytes() const { return impl_->backend->workspace_bytes(); }
const MoeStats& TpMoe::last_stats() const { return impl_->last_stats(); }

}  // namespace pmoe
