// EpMoe's front end: experts spread over the ranks, tokens sharded. It checks that every rank has
// the same config and validates every call's tensors; the backend for the communicator's device
// (src/backends/registry.hpp) does the work: the CPU's (src/cpu/ep_moe.cpp) or a device's
// (src/cuda/moe/ep_moe.cu), both on AllToAll's dispatch and combine.
#include <algorithm>
#include <functional>
#include <vector>

#include "backends/moe_backend.hpp"
#include "backends/registry.hpp"
#include "moe/expert_slots.hpp"
#include "moe/layer_core.hpp"

namespace pmoe {

namespace {

// This rank's own checks.
void check_config(const MoeConfig& config, int world_size, int max_tokens,
                  const EpMoeOptions& options) {
  config.validate();
  detail::check_max_tokens("EpMoe", "max_tokens", max_tokens);
  const ExpertPlacement& placement = options.placement;
  if (placement.empty()) {
    PMOE_CHECK(config.num_experts % world_size == 0, "EpMoe: num_experts = ", config.num_experts,
               " is not divisible by the ", world_size,
               " ranks; EP gives every rank the same number of whole experts: use a multiple of ",
               world_size, " experts or a number of ranks that divides ", config.num_experts);
  } else {
    PMOE_CHECK(placement.num_logical_experts == config.num_experts, "EpMoe: the placement has ",
               placement.num_logical_experts, " logical experts but the layer has num_experts = ",
               config.num_experts, "; they must be the same");
    const int slots = int(placement.slot_expert.size());
    PMOE_CHECK(slots % world_size == 0, "EpMoe: the placement's ", slots, " slots are not "
               "divisible by the ", world_size, " ranks; give every rank the same number");
    placement.validate(slots);
  }
  PMOE_CHECK(options.micro_batches == 1 || options.micro_batches == 2,
             "EpMoe: micro_batches must be 1 or 2, got ", options.micro_batches);
}

MoeConfig validated(Communicator& comm, const MoeConfig& config, int max_tokens,
                    const EpMoeOptions& options) {
  const MoeConfig current = config.with_current_names();
  detail::agree_on_layer(
      comm, "EpMoe", current,
      [&](detail::ConfigAgreement& agree) {
        agree.field("max_tokens", max_tokens);
        agree.field("micro_batches", options.micro_batches);
        agree.field("placement (its slots)", int64_t(options.placement.slot_expert.size()));
        agree.field("rank_mask", options.rank_mask, detail::show_bool);
        agree.field("on_peer_loss (0 fail, 1 mask)", int64_t(options.on_peer_loss));
      },
      [&] { check_config(config, comm.size(), max_tokens, options); });
  return current;
}

// With two micro-batches each half has its exchange: when one raises PeerLost the other is
// left mid-call, so it goes on without the same ranks (and, if its agreement found more, the
// first follows it). Every survivor does the same, so each exchange's agreement completes.
void following_losses(detail::MoeBackend& backend, const std::function<void()>& call) {
  try {
    call();
  } catch (const PeerLost&) {
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<int> lost;
      backend.change_membership([&](AllToAll& a2a) {
        const std::vector<uint8_t>& live = a2a.rank_mask().live;
        for (size_t r = 0; r < live.size(); ++r)
          if (!live[r] && std::find(lost.begin(), lost.end(), int(r)) == lost.end())
            lost.push_back(int(r));
      });
      backend.change_membership([&](AllToAll& a2a) {
        try {
          a2a.go_on_without(lost);
        } catch (const PeerLost&) {  // the calls it names are the ones rethrown below
        }
      });
    }
    throw;
  }
}

}  // namespace

struct EpMoe::Impl : detail::LayerCore {
  Impl(Communicator& comm, const MoeConfig& config, int max_tokens, const EpMoeOptions& options)
      : LayerCore(validated(comm, config, max_tokens, options), max_tokens, comm.device()),
        micro_batches(options.micro_batches) {
    backend = detail::backends(device).make_ep_moe(comm, LayerCore::config, max_tokens, options);
  }
  int micro_batches;
};

EpMoe::EpMoe(Communicator& comm, const MoeConfig& config, int max_tokens,
             int micro_batches)
    : EpMoe(comm, config, max_tokens, EpMoeOptions{micro_batches}) {}

EpMoe::EpMoe(Communicator& comm, const MoeConfig& config, int max_tokens,
             const EpMoeOptions& options)
    : impl_(std::make_unique<Impl>(comm, config, max_tokens, options)) {}

void EpMoe::mask_rank(int rank, const std::string& reason) {
  impl_->backend->change_membership([&](AllToAll& a2a) { a2a.mask_rank(rank, reason); });
}
void EpMoe::unmask_rank(int rank) {
  impl_->backend->change_membership([&](AllToAll& a2a) { a2a.unmask_rank(rank); });
}
void EpMoe::rejoin() {
  impl_->backend->change_membership([](AllToAll& a2a) { a2a.rejoin(); });
}
void EpMoe::check_errors() {
  following_losses(*impl_->backend, [&] {
    impl_->backend->change_membership([](AllToAll& a2a) { a2a.check_errors(); });
  });
}
const RankMask& EpMoe::rank_mask() const { return impl_->backend->exchange().rank_mask(); }
std::vector<int> EpMoe::lost_experts() const {
  return impl_->backend->exchange().lost_experts();
}

EpMoe::~EpMoe() = default;

void EpMoe::forward(const Tensor& x, const Tensor& y) {
  following_losses(*impl_->backend,
                   [&] { impl_->forward("EpMoe::forward", x, y); });
}

const MoeConfig& EpMoe::config() const { return impl_->config; }
int EpMoe::micro_batches() const { return impl_->micro_batches; }
size_t EpMoe::weight_bytes() const { return impl_->backend->weight_bytes(); }
size_t EpMoe::workspace_bytes() const { return impl_->backend->workspace_bytes(); }
const MoeStats& EpMoe::last_stats() const { return impl_->last_stats(); }

namespace detail {

AllToAllConfig ep_exchange_config(const MoeConfig& config, const EpMoeOptions& options,
                                  int tokens_per_batch, int wire_dim, bool in_place) {
  AllToAllConfig a2a;
  // The layer's shape, but over its slots (a placement may add replicas) and its wire's width.
  a2a.shape() = {tokens_per_batch, slot_count(config, options.placement), config.top_k, wire_dim};
  a2a.in_dtype = config.dtype;
  a2a.out_dtype = config.dtype;
  a2a.in_place_buffers = in_place;
  a2a.placement = options.placement;
  a2a.rank_mask = options.rank_mask;
  a2a.masked_experts = options.masked_experts;
  a2a.on_peer_loss = options.on_peer_loss;
  a2a.peer_timeout_s = options.peer_timeout_s;
  return a2a;
}

}  // namespace detail
}  // namespace pmoe
