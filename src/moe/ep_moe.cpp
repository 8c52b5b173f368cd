// EpMoe: route this rank's tokens, send them to the ranks owning their experts (AllToAll
// dispatch), run each local expert once over all the rows it received, send the rows back and
// sum them with the router weights (AllToAll combine).
//
// AllToAll moves rows of one width both ways, so the wire width is max(H, O): with H < O the
// tokens are staged into zero-padded rows, with O < H the expert rows carry zero padding that is
// dropped after combine. Buffers per rank (C = tokens per micro-batch, W ranks):
//
//   x_wire / y_wire   [max_tokens, wire] dtype    staging, only where H or O < wire
//   expert_x          [E_local, W * C, wire]      dispatch's output: expert e's rows first
//   expert_y          [E_local, W * C, wire]      the experts' outputs, same rows; cols [0, O)
//
// micro_batches = 2 splits the tokens into halves A and B, each with its own AllToAll:
//
//   dispatch A send, dispatch B send, dispatch A recv, experts A, combine A send,
//   dispatch B recv, experts B, combine B send, combine A recv, combine B recv
//
// so the wait for B's tokens and for A's returning rows runs behind the other half's experts.
// Halves use expert_x / expert_y one after the other, so they share them.
#include <algorithm>
#include <chrono>
#include <optional>

#include "backends/registry.hpp"
#include "moe/ep_traffic.hpp"
#include "moe/layer_args.hpp"
#include "pmoe/all_to_all.hpp"

namespace pmoe {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

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
  Impl(Communicator& comm, const MoeConfig& config_in, int max_tokens_in, int micro_batches_in)
      : config(validated(comm, config_in, max_tokens_in, micro_batches_in)),
        max_tokens(max_tokens_in),
        micro_batches(micro_batches_in),
        rank(comm.rank()),
        world_size(comm.size()),
        num_local(config.num_experts / comm.size()),
        wire_dim(std::max(config.feature_dim, config.out_dim())),
        per_batch((max_tokens + micro_batches - 1) / micro_batches),
        device(comm.device()) {
    if (device.kind != Device::Kind::cpu) {  // src/cuda/moe/ep_moe.cu
      on_device = detail::backends(device).make_ep_moe(comm, config, max_tokens, micro_batches);
      return;
    }
    router.emplace(config);
    experts.emplace(config, comm.rank() * num_local, num_local, 0, config.ffn_dim);
    const int H = config.feature_dim, O = config.out_dim(), k = config.top_k;
    if (config.dtype != DType::f32) x_f32 = Buffer(DType::f32, {max_tokens, H});
    if (H < wire_dim) x_wire = Buffer(config.dtype, {max_tokens, wire_dim});
    if (O < wire_dim) y_wire = Buffer(config.dtype, {max_tokens, wire_dim});
    indices = Buffer(DType::i32, {max_tokens, k});
    weights = Buffer(DType::f32, {max_tokens, k});
    counts = Buffer(DType::i32, {micro_batches, num_local});
    const int64_t rows = int64_t(world_size) * per_batch;
    expert_x = Buffer(config.dtype, {num_local, rows, wire_dim});
    expert_y = Buffer(config.dtype, {num_local, rows, wire_dim});
    AllToAllConfig a2a;
    a2a.max_num_tokens = per_batch;
    a2a.num_experts = config.num_experts;
    a2a.experts_per_token = k;
    a2a.hidden_dim = wire_dim;
    a2a.in_dtype = config.dtype;
    a2a.out_dtype = config.dtype;
    for (int b = 0; b < micro_batches; ++b)
      exchanges.push_back(std::make_unique<AllToAll>(comm, a2a));
  }

  // One micro-batch: tokens [begin, end) of this forward.
  struct Batch {
    int index, begin, end;
    Tensor x, indices, weights, y;  // the batch's rows of the wire input, routing and output
  };

  Batch batch(int index, int begin, int end, const Tensor& x_send, const Tensor& y_recv) const {
    const int n = end - begin, k = config.top_k;
    const size_t row_bytes = size_t(wire_dim) * dtype_size(config.dtype);
    auto* xs = static_cast<std::byte*>(x_send.data()) + size_t(begin) * row_bytes;
    auto* ys = static_cast<std::byte*>(y_recv.data()) + size_t(begin) * row_bytes;
    return {index,
            begin,
            end,
            Tensor(xs, config.dtype, {n, wire_dim}),
            Tensor(indices.data<int32_t>() + int64_t(begin) * k, DType::i32, {n, k}),
            Tensor(weights.data<float>() + int64_t(begin) * k, DType::f32, {n, k}),
            Tensor(ys, config.dtype, {n, wire_dim})};
  }

  int32_t* batch_counts(const Batch& b) const {
    return counts.data<int32_t>() + b.index * num_local;
  }

  void dispatch(const Batch& b, Phase phase) {
    const auto start = Clock::now();
    exchanges[size_t(b.index)]->dispatch(b.x, Tensor(), b.indices,
                                         Tensor(batch_counts(b), DType::i32, {num_local}), expert_x,
                                         Tensor(), phase);
    stats.dispatch_s += seconds_since(start);
  }

  void combine(const Batch& b, Phase phase) {
    const auto start = Clock::now();
    exchanges[size_t(b.index)]->combine(expert_y, b.indices, b.weights, b.y, phase);
    stats.combine_s += seconds_since(start);
  }

  // Each local expert once over the rows it received.
  void run_experts(const Batch& b) {
    const auto start = Clock::now();
    const int H = config.feature_dim, O = config.out_dim();
    const int64_t rows_per_expert = int64_t(world_size) * per_batch;
    const size_t expert_bytes = size_t(rows_per_expert) * wire_dim * dtype_size(config.dtype);
    const int32_t* received = batch_counts(b);
    for (int e = 0; e < num_local; ++e) {
      if (received[e] == 0) continue;
      auto* in = static_cast<std::byte*>(expert_x.data<void>()) + size_t(e) * expert_bytes;
      auto* out = static_cast<std::byte*>(expert_y.data<void>()) + size_t(e) * expert_bytes;
      experts->forward(e, detail::row_view(in, config.dtype, received[e], H, wire_dim),
                      detail::row_view(out, config.dtype, received[e], O, wire_dim));
      stats.expert_rows += received[e];
    }
    stats.experts_s += seconds_since(start);
  }

  // Payload bytes this rank's tokens move between ranks (moe/ep_traffic.hpp).
  int64_t bytes_moved(int m) const {
    const int k = config.top_k;
    const int32_t* idx = indices.data<int32_t>();
    int64_t rows = 0;
    for (int t = 0; t < m; ++t)
      rows +=
          detail::ep_token_rows_moved(idx + int64_t(t) * k, k, config.num_experts, num_local, rank);
    return rows * wire_dim * int64_t(dtype_size(config.dtype));
  }

  MoeConfig config;
  int max_tokens, micro_batches, rank, world_size, num_local, wire_dim, per_batch;
  Device device;
  std::unique_ptr<detail::MoeBackend> on_device;  // on a CUDA device; the rest is the CPU's
  std::optional<Router> router;
  std::optional<Experts> experts;
  std::vector<std::unique_ptr<AllToAll>> exchanges;  // one per micro-batch
  Buffer x_f32;     // [max_tokens, H] f32: the router's input when dtype is bf16
  Buffer x_wire;    // [max_tokens, wire] dtype, when H < wire
  Buffer y_wire;    // [max_tokens, wire] dtype, when O < wire
  Buffer indices;   // [max_tokens, k] i32
  Buffer weights;   // [max_tokens, k] f32
  Buffer counts;    // [micro_batches, E_local] i32
  Buffer expert_x;  // [E_local, W * per_batch, wire] dtype
  Buffer expert_y;  // [E_local, W * per_batch, wire] dtype
  MoeStats stats;
};

EpMoe::EpMoe(Communicator& comm, const MoeConfig& config, int max_tokens_per_rank,
             int micro_batches)
    : impl_(std::make_unique<Impl>(comm, config, max_tokens_per_rank, micro_batches)) {}

EpMoe::~EpMoe() = default;

void EpMoe::forward(const Tensor& x, const Tensor& y) {
  Impl& p = *impl_;
  const MoeConfig& c = p.config;
  detail::check_forward("EpMoe::forward", c, p.max_tokens, "max_tokens_per_rank", x, y, p.device);
  const int m = int(x.size(0)), H = c.feature_dim, O = c.out_dim(), k = c.top_k;
  p.stats = MoeStats();
  if (p.on_device) {
    p.on_device->forward(x, y, p.stats);
    return;
  }
  p.stats.tokens = m;

  // Route, and stage the tokens at the wire width.
  auto start = Clock::now();
  const Tensor x_f32 =
      c.dtype == DType::f32 ? x : detail::row_view(p.x_f32.data<float>(), DType::f32, m, H, H);
  if (c.dtype != DType::f32) detail::rows_to_f32(x, x_f32.data<float>(), H);
  p.router->route(x_f32, detail::row_view(p.indices.data<int32_t>(), DType::i32, m, k, k),
                 detail::row_view(p.weights.data<float>(), DType::f32, m, k, k));
  Tensor x_send = x, y_recv = y;
  if (H < p.wire_dim) {
    const size_t elem = dtype_size(c.dtype);
    auto* staged = p.x_wire.data<std::byte>();
    for (int t = 0; t < m; ++t)  // columns [H, wire) stay zero from the allocation
      std::copy_n(static_cast<const std::byte*>(x.data()) + size_t(t) * H * elem, H * elem,
                  staged + size_t(t) * p.wire_dim * elem);
    x_send = Tensor(staged, c.dtype, {m, p.wire_dim});
  }
  if (O < p.wire_dim) y_recv = Tensor(p.y_wire.data<void>(), c.dtype, {m, p.wire_dim});
  p.stats.router_flops = p.router->flops(m);
  p.stats.bytes_moved = p.bytes_moved(m);
  p.stats.route_s = seconds_since(start);

  if (p.micro_batches == 1) {
    const Impl::Batch all = p.batch(0, 0, m, x_send, y_recv);
    p.dispatch(all, Phase::both);
    p.run_experts(all);
    p.combine(all, Phase::both);
  } else {
    const int half = (m + 1) / 2;
    const Impl::Batch a = p.batch(0, 0, half, x_send, y_recv);
    const Impl::Batch b = p.batch(1, half, m, x_send, y_recv);
    p.dispatch(a, Phase::send);
    p.dispatch(b, Phase::send);
    p.dispatch(a, Phase::recv);
    p.run_experts(a);
    p.combine(a, Phase::send);
    p.dispatch(b, Phase::recv);
    p.run_experts(b);
    p.combine(b, Phase::send);
    p.combine(a, Phase::recv);
    p.combine(b, Phase::recv);
  }

  if (O < p.wire_dim) {
    const size_t elem = dtype_size(c.dtype);
    for (int t = 0; t < m; ++t)
      std::copy_n(p.y_wire.data<std::byte>() + size_t(t) * p.wire_dim * elem, O * elem,
                  static_cast<std::byte*>(y.data()) + size_t(t) * O * elem);
  }
  p.stats.expert_flops = p.experts->flops(p.stats.expert_rows);
  p.stats.expert_rows_used = p.stats.expert_rows_live = p.stats.expert_rows;  // no tiles here
}

const MoeConfig& EpMoe::config() const { return impl_->config; }
int EpMoe::micro_batches() const { return impl_->micro_batches; }
size_t EpMoe::weight_bytes() const {
  if (impl_->on_device) return impl_->on_device->weight_bytes();
  return impl_->router->weight_bytes() + impl_->experts->weight_bytes();
}
size_t EpMoe::workspace_bytes() const {
  const Impl& p = *impl_;
  if (p.on_device) return p.on_device->workspace_bytes();
  size_t bytes = p.router->workspace_bytes() + p.experts->workspace_bytes() + p.x_f32.nbytes() +
                 p.x_wire.nbytes() + p.y_wire.nbytes() + p.indices.nbytes() + p.weights.nbytes() +
                 p.counts.nbytes() + p.expert_x.nbytes() + p.expert_y.nbytes();
  for (const auto& exchange : p.exchanges) bytes += exchange->workspace_bytes();
  return bytes;
}
const MoeStats& EpMoe::last_stats() const {
  if (impl_->on_device) impl_->on_device->finish_stats(impl_->stats);
  return impl_->stats;
}

}  // namespace pmoe
