// TpMoe: every rank runs all tokens through its hidden slice of every expert (LocalMoe), which
// gives a partial output; one all-reduce of the partials per forward completes it.
//
// Per rank and forward (B tokens, k slots, W ranks): expert FLOPs 2 B k (g H + O) F / W, router
// FLOPs 2 B H E (replicated), bytes sent 2 (W - 1) / W * B O * 4 (f32 partials).
#include <chrono>

#include "cpu/all_reduce.hpp"
#include "backends/registry.hpp"
#include "moe/layer_args.hpp"
#include "moe/local_moe.hpp"

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
        device(comm.device()) {
    if (device.kind != Device::Kind::cpu) {  // src/cuda/moe/tp_moe.cu
      on_device = detail::backends(device).make_tp_moe(comm, config, max_tokens);
      return;
    }
    moe = std::make_unique<detail::LocalMoe>(config, max_tokens,
                                             comm.rank() * (config.ffn_dim / comm.size()),
                                             (comm.rank() + 1) * (config.ffn_dim / comm.size()));
    all_reduce = std::make_unique<cpu::AllReduceSum>(comm, int64_t(max_tokens) * config.out_dim());
    partial = Buffer(DType::f32, {max_tokens, config.out_dim()});
  }
  MoeConfig config;
  int max_tokens;
  Device device;
  std::unique_ptr<detail::MoeBackend> on_device;  // on a CUDA device; the rest is the CPU's
  std::unique_ptr<detail::LocalMoe> moe;
  std::unique_ptr<cpu::AllReduceSum> all_reduce;
  Buffer partial;  // [max_tokens, O] f32
  MoeStats stats;
};

TpMoe::TpMoe(Communicator& comm, const MoeConfig& config, int max_tokens)
    : impl_(std::make_unique<Impl>(comm, config, max_tokens)) {}

TpMoe::~TpMoe() = default;

void TpMoe::forward(const Tensor& x, const Tensor& y) {
  Impl& p = *impl_;
  detail::check_forward("TpMoe::forward", p.config, p.max_tokens, "max_tokens", x, y, p.device);
  p.stats = MoeStats();
  if (p.on_device) {
    p.on_device->forward(x, y, p.stats);
    return;
  }
  const int64_t n = x.size(0) * p.config.out_dim();
  float* partial = p.config.dtype == DType::f32 ? y.data<float>() : p.partial.data<float>();
  p.moe->forward(x, partial, p.stats);
  const auto start = std::chrono::steady_clock::now();
  p.all_reduce->run(partial, n, "TpMoe::forward");
  p.stats.reduce_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  p.stats.bytes_moved = p.all_reduce->bytes_sent(n);
  if (p.config.dtype != DType::f32) detail::rows_from_f32(partial, p.config.out_dim(), y);
}

const MoeConfig& TpMoe::config() const { return impl_->config; }
size_t TpMoe::weight_bytes() const {
  return impl_->on_device ? impl_->on_device->weight_bytes() : impl_->moe->weight_bytes();
}
size_t TpMoe::workspace_bytes() const {
  if (impl_->on_device) return impl_->on_device->workspace_bytes();
  return impl_->moe->workspace_bytes() + impl_->all_reduce->workspace_bytes() +
         impl_->partial.nbytes();
}
const MoeStats& TpMoe::last_stats() const {
  if (impl_->on_device) impl_->on_device->finish_stats(impl_->stats);
  return impl_->stats;
}

}  // namespace pmoe
