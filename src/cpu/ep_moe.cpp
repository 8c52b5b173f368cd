// EpMoe on the CPU: route this rank's tokens, send them to the ranks owning their experts
// (AllToAll dispatch), run each local expert once over all the rows it received, send the rows
// back and sum them with the router weights (AllToAll combine).
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
#include <memory>
#include <vector>

#include "all_to_all/slot_table.hpp"
#include "backends/moe_backend.hpp"
#include "moe/ep_traffic.hpp"
#include "moe/expert_slots.hpp"
#include "moe/rows.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class CpuEpMoe final : public MoeBackend {
 public:
  CpuEpMoe(Communicator& comm, const MoeConfig& config, int max_tokens,
           const EpMoeOptions& options)
      : config_(config),
        micro_batches_(options.micro_batches),
        rank_(comm.rank()),
        world_size_(comm.size()),
        num_local_(slot_count(config, options.placement) / comm.size()),
        wire_dim_(std::max(config.hidden_dim, config.out_dim())),
        per_batch_((max_tokens + micro_batches_ - 1) / micro_batches_),
        router_(config),
        experts_(config, rank_experts(config, options.placement, comm.rank(), comm.size()), 0,
                 config.ffn_dim) {
    const int micro_batches = micro_batches_;
    const int H = config.hidden_dim, O = config.out_dim(), k = config.top_k;
    if (config.dtype != DType::f32) x_f32_ = Buffer(DType::f32, {max_tokens, H});
    if (H < wire_dim_) x_wire_ = Buffer(config.dtype, {max_tokens, wire_dim_});
    if (O < wire_dim_) y_wire_ = Buffer(config.dtype, {max_tokens, wire_dim_});
    indices_ = Buffer(DType::i32, {max_tokens, k});
    weights_ = Buffer(DType::f32, {max_tokens, k});
    counts_ = Buffer(DType::i32, {micro_batches, num_local_});
    const int64_t rows = int64_t(world_size_) * per_batch_;
    expert_x_ = Buffer(config.dtype, {num_local_, rows, wire_dim_});
    expert_y_ = Buffer(config.dtype, {num_local_, rows, wire_dim_});
    const AllToAllConfig a2a = ep_exchange_config(config, options, per_batch_, wire_dim_, false);
    for (int b = 0; b < micro_batches; ++b)
      exchanges_.push_back(std::make_unique<AllToAll>(comm, a2a));
    slot_table_ = std::make_unique<SlotTable>(a2a, world_size_);
  }

  void change_membership(const std::function<void(AllToAll&)>& change) override {
    for (auto& exchange : exchanges_) change(*exchange);
    slot_table_->set_live(exchanges_.front()->rank_mask().live);
  }
  const AllToAll& exchange() const override { return *exchanges_.front(); }

  void forward(const Tensor& x, const Tensor& y, MoeStats& stats) override;

  size_t weight_bytes() const override { return router_.weight_bytes() + experts_.weight_bytes(); }
  size_t workspace_bytes() const override {
    size_t bytes = router_.workspace_bytes() + experts_.workspace_bytes() + x_f32_.nbytes() +
                   x_wire_.nbytes() + y_wire_.nbytes() + indices_.nbytes() + weights_.nbytes() +
                   counts_.nbytes() + expert_x_.nbytes() + expert_y_.nbytes();
    for (const auto& exchange : exchanges_) bytes += exchange->workspace_bytes();
    return bytes;
  }

 private:
  // One micro-batch: tokens [begin, end) of this forward.
  struct Batch {
    int index, begin, end;
    Tensor x, indices, weights, y;  // the batch's rows of the wire input, routing and output
  };

  Batch batch(int index, int begin, int end, const Tensor& x_send, const Tensor& y_recv) const {
    const int n = end - begin, k = config_.top_k;
    const size_t row_bytes = size_t(wire_dim_) * dtype_size(config_.dtype);
    auto* xs = static_cast<std::byte*>(x_send.data()) + size_t(begin) * row_bytes;
    auto* ys = static_cast<std::byte*>(y_recv.data()) + size_t(begin) * row_bytes;
    return {index,
            begin,
            end,
            Tensor(xs, config_.dtype, {n, wire_dim_}),
            Tensor(indices_.data<int32_t>() + int64_t(begin) * k, DType::i32, {n, k}),
            Tensor(weights_.data<float>() + int64_t(begin) * k, DType::f32, {n, k}),
            Tensor(ys, config_.dtype, {n, wire_dim_})};
  }

  int32_t* batch_counts(const Batch& b) const {
    return counts_.data<int32_t>() + b.index * num_local_;
  }

  void dispatch(const Batch& b, Phase phase, MoeStats& stats) {
    const auto start = Clock::now();
    following_losses([&] {
      exchanges_[size_t(b.index)]->dispatch(b.x, Tensor(), b.indices,
                                            Tensor(batch_counts(b), DType::i32, {num_local_}),
                                            expert_x_, Tensor(), phase);
    });
    stats.dispatch_s += seconds_since(start);
  }

  void combine(const Batch& b, Phase phase, MoeStats& stats) {
    const auto start = Clock::now();
    following_losses(
        [&] { exchanges_[size_t(b.index)]->combine(expert_y_, b.indices, b.weights, b.y, phase); });
    stats.combine_s += seconds_since(start);
  }

  // An exchange that lost a peer (on_peer_loss = mask, one micro-batch) masked it: so must the
  // layer's copy of its routing.
  template <typename Exchange>
  void following_losses(Exchange&& exchange) {
    try {
      exchange();
    } catch (const PeerLost&) {
      slot_table_->set_live(exchanges_.front()->rank_mask().live);
      throw;
    }
  }

  // Each local expert once over the rows it received.
  void run_experts(const Batch& b, MoeStats& stats) {
    const auto start = Clock::now();
    const int H = config_.hidden_dim, O = config_.out_dim();
    const int64_t rows_per_expert = int64_t(world_size_) * per_batch_;
    const size_t expert_bytes = size_t(rows_per_expert) * wire_dim_ * dtype_size(config_.dtype);
    const int32_t* received = batch_counts(b);
    for (int e = 0; e < num_local_; ++e) {
      if (received[e] == 0) continue;
      auto* in = static_cast<std::byte*>(expert_x_.data<void>()) + size_t(e) * expert_bytes;
      auto* out = static_cast<std::byte*>(expert_y_.data<void>()) + size_t(e) * expert_bytes;
      experts_.forward(e, row_view(in, config_.dtype, received[e], H, wire_dim_),
                       row_view(out, config_.dtype, received[e], O, wire_dim_));
      stats.expert_rows += received[e];
    }
    stats.experts_s += seconds_since(start);
  }

  // Payload bytes this rank's tokens move between ranks (moe/ep_traffic.hpp), counted on the
  // slots the exchange routes each token to (a placement's and the mask's choice).
  int64_t bytes_moved(int m) const {
    const int k = config_.top_k, slots = num_local_ * world_size_;
    const int32_t* idx = indices_.data<int32_t>();
    std::vector<int32_t> routed(static_cast<size_t>(k));
    int64_t rows = 0;
    // A token's index in its micro-batch's exchange, which the routing rule reads.
    const int half = micro_batches_ == 2 ? (m + 1) / 2 : m;
    for (int t = 0; t < m; ++t) {
      const int32_t* row = idx + int64_t(t) * k;
      if (slot_table_->rewrites()) {
        route_row(slot_table_->view(), row, k, rank_, t < half ? t : t - half, routed.data(),
                  nullptr, nullptr);
        row = routed.data();
      }
      rows += ep_token_rows_moved(row, k, slots, num_local_, rank_);
    }
    return rows * wire_dim_ * int64_t(dtype_size(config_.dtype));
  }

  MoeConfig config_;
  int micro_batches_, rank_, world_size_, num_local_, wire_dim_, per_batch_;
  Router router_;
  Experts experts_;
  std::vector<std::unique_ptr<AllToAll>> exchanges_;  // one per micro-batch
  std::unique_ptr<SlotTable> slot_table_;  // the exchanges' routing, for bytes_moved
  Buffer x_f32_;     // [max_tokens, H] f32: the router's input when dtype is bf16
  Buffer x_wire_;    // [max_tokens, wire] dtype, when H < wire
  Buffer y_wire_;    // [max_tokens, wire] dtype, when O < wire
  Buffer indices_;   // [max_tokens, k] i32
  Buffer weights_;   // [max_tokens, k] f32
  Buffer counts_;    // [micro_batches, E_local] i32
  Buffer expert_x_;  // [E_local, W * per_batch, wire] dtype
  Buffer expert_y_;  // [E_local, W * per_batch, wire] dtype
};

void CpuEpMoe::forward(const Tensor& x, const Tensor& y, MoeStats& stats) {
  const MoeConfig& c = config_;
  const int m = int(x.size(0)), H = c.hidden_dim, O = c.out_dim(), k = c.top_k;
  stats.tokens = m;

  // Route, and stage the tokens at the wire width.
  auto start = Clock::now();
  const Tensor x_f32 =
      c.dtype == DType::f32 ? x : row_view(x_f32_.data<float>(), DType::f32, m, H, H);
  if (c.dtype != DType::f32) rows_to_f32(x, x_f32.data<float>(), H);
  router_.route(x_f32, row_view(indices_.data<int32_t>(), DType::i32, m, k, k),
                row_view(weights_.data<float>(), DType::f32, m, k, k));
  Tensor x_send = x, y_recv = y;
  if (H < wire_dim_) {
    const size_t elem = dtype_size(c.dtype);
    auto* staged = x_wire_.data<std::byte>();
    for (int t = 0; t < m; ++t)  // columns [H, wire) stay zero from the allocation
      std::copy_n(static_cast<const std::byte*>(x.data()) + size_t(t) * H * elem, H * elem,
                  staged + size_t(t) * wire_dim_ * elem);
    x_send = Tensor(staged, c.dtype, {m, wire_dim_});
  }
  if (O < wire_dim_) y_recv = Tensor(y_wire_.data<void>(), c.dtype, {m, wire_dim_});
  stats.router_flops = router_.flops(m);
  stats.bytes_moved = bytes_moved(m);
  stats.route_s = seconds_since(start);

  if (micro_batches_ == 1) {
    const Batch all = batch(0, 0, m, x_send, y_recv);
    dispatch(all, Phase::both, stats);
    run_experts(all, stats);
    combine(all, Phase::both, stats);
  } else {
    const int half = (m + 1) / 2;
    const Batch a = batch(0, 0, half, x_send, y_recv);
    const Batch b = batch(1, half, m, x_send, y_recv);
    dispatch(a, Phase::send, stats);
    dispatch(b, Phase::send, stats);
    dispatch(a, Phase::recv, stats);
    run_experts(a, stats);
    combine(a, Phase::send, stats);
    dispatch(b, Phase::recv, stats);
    run_experts(b, stats);
    combine(b, Phase::send, stats);
    combine(a, Phase::recv, stats);
    combine(b, Phase::recv, stats);
  }

  if (O < wire_dim_) {
    const size_t elem = dtype_size(c.dtype);
    for (int t = 0; t < m; ++t)
      std::copy_n(y_wire_.data<std::byte>() + size_t(t) * wire_dim_ * elem, O * elem,
                  static_cast<std::byte*>(y.data()) + size_t(t) * O * elem);
  }
  stats.expert_flops = experts_.flops(stats.expert_rows);
  stats.expert_rows_used = stats.expert_rows_live = stats.expert_rows;  // no tiles here
}

}  // namespace

std::unique_ptr<MoeBackend> make_cpu_ep_moe(Communicator& comm, const MoeConfig& config,
                                            int max_tokens, const EpMoeOptions& options) {
  return std::make_unique<CpuEpMoe>(comm, config, max_tokens, options);
}

}  // namespace pmoe::detail
