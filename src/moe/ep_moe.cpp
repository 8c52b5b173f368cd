// EpMoe's front end: experts spread over the ranks, tokens sharded. It checks that every rank has
// the same config and validates every call's tensors; the backend for the communicator's device
// (src/backends/registry.hpp) does the work: the CPU's (src/cpu/ep_moe.cpp) or a device's
// (src/cuda/moe/ep_moe.cu), both on AllToAll's dispatch and combine.
#include "backends/registry.hpp"
#include "moe/layer_args.hpp"

namespace pmoe {

namespace {

// This rank's own checks.
void check_config(const MoeConfig& config, int world_size, int max_tokens, int micro_batches) {
  config.validate();
  detail::check_max_tokens("EpMoe", "max_tokens_per_rank", max_tokens);
  PMOE_CHECK(config.num_experts % world_size == 0, "EpMoe: num_experts = ", config.num_experts,
             " is not divisible by the ", world_size,
             " ranks; EP gives every rank the same number of whole experts: use a multiple of ",
             world_size, " experts or a number of ranks that divides ", config.num_experts);
  PMOE_CHECK(micro_batches == 1 || micro_batches == 2, "EpMoe: micro_batches must be 1 or 2, got ",
             micro_batches);
}

const MoeConfig& validated(Communicator& comm, const MoeConfig& config, int max_tokens,
                           int micro_batches) {
  detail::agree_on_layer(
      comm, "EpMoe", config,
      [&](detail::ConfigAgreement& agree) {
        agree.field("max_tokens_per_rank", max_tokens);
        agree.field("micro_batches", micro_batches);
      },
      [&] { check_config(config, comm.size(), max_tokens, micro_batches); });
  return config;
}

}  // namespace

struct EpMoe::Impl {
  Impl(Communicator& comm, const MoeConfig& config_in, int max_tokens, int micro_batches)
      : config(validated(comm, config_in, max_tokens, micro_batches)),
        max_tokens(max_tokens),
        micro_batches(micro_batches),
        device(comm.device()),
        backend(detail::backends(device).make_ep_moe(comm, config, max_tokens, micro_batches)) {}
  MoeConfig config;
  int max_tokens, micro_batches;
  Device device;
  std::unique_ptr<detail::MoeBackend> backend;
  MoeStats stats;
};

EpMoe::EpMoe(Communicator& comm, const MoeConfig& config, int max_tokens_per_rank,
             int micro_batches)
    : impl_(std::make_unique<Impl>(comm, config, max_tokens_per_rank, micro_batches)) {}

EpMoe::~EpMoe() = default;

void EpMoe::forward(const Tensor& x, const Tensor& y) {
  Impl& p = *impl_;
  detail::check_forward("EpMoe::forward", p.config, p.max_tokens, "max_tokens_per_rank", x, y,
                        p.device);
  p.stats = MoeStats();
  p.backend->forward(x, y, p.stats);
}

const MoeConfig& EpMoe::config() const { return impl_->config; }
int EpMoe::micro_batches() const { return impl_->micro_batches; }
size_t EpMoe::weight_bytes() const { return impl_->backend->weight_bytes(); }
size_t EpMoe::workspace_bytes() const { return impl_->backend->workspace_bytes(); }
const MoeStats& EpMoe::last_stats() const {
  impl_->backend->finish_stats(impl_->stats);
  return impl_->stats;
}

}  // namespace pmoe
