// TpMoe's front end: every expert's hidden columns split across the ranks, tokens replicated. It
// checks that every rank has the same config and validates every call's tensors; the backend for
// the communicator's device (src/backends/registry.hpp) does the work: the CPU's
// (src/cpu/tp_moe.cpp) or a device's (src/cuda/moe/tp_moe.cu).
#include "backends/registry.hpp"
#include "moe/layer_args.hpp"

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

const MoeConfig& validated(Communicator& comm, const MoeConfig& config, int max_tokens) {
  detail::agree_on_layer(
      comm, "TpMoe", config,
      [&](detail::ConfigAgreement& agree) { agree.field("max_tokens", max_tokens); },
      [&] { check_config(config, comm.size(), max_tokens); });
  return config;
}

}  // namespace

struct TpMoe::Impl {
  Impl(Communicator& comm, const MoeConfig& config_in, int max_tokens)
      : config(validated(comm, config_in, max_tokens)),
        max_tokens(max_tokens),
        device(comm.device()),
        backend(detail::backends(device).make_tp_moe(comm, config, max_tokens)) {}
  MoeConfig config;
  int max_tokens;
  Device device;
  std::unique_ptr<detail::MoeBackend> backend;
  MoeStats stats;
};

TpMoe::TpMoe(Communicator& comm, const MoeConfig& config, int max_tokens)
    : impl_(std::make_unique<Impl>(comm, config, max_tokens)) {}

TpMoe::~TpMoe() = default;

void TpMoe::forward(const Tensor& x, const Tensor& y) {
  Impl& p = *impl_;
  detail::check_forward("TpMoe::forward", p.config, p.max_tokens, "max_tokens", x, y, p.device);
  p.stats = MoeStats();
  p.backend->forward(x, y, p.stats);
}

const MoeConfig& TpMoe::config() const { return impl_->config; }
size_t TpMoe::weight_bytes() const { return impl_->backend->weight_bytes(); }
size_t TpMoe::workspace_bytes() const { return impl_->backend->workspace_bytes(); }
const MoeStats& TpMoe::last_stats() const {
  impl_->backend->finish_stats(impl_->stats);
  return impl_->stats;
}

}  // namespace pmoe
