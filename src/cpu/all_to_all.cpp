// AllToAll on the CPU backend: plain copies into peers' symmetric regions, epoch signals, and a
// receive side that lays rows out per expert. The buffer layout is drawn in
// src/all_to_all/layout.hpp, which the CUDA kernels read too.
//
// Why buffers can be reused without a barrier: source s writes block s of rank r for call c+1
// only after its combine(recv) of call c, which waited for r's combine signal, which r sends only
// after it finished reading block s (and s's in-place input) of call c. Symmetrically, r writes
// s's combine area for call c+1 only after its dispatch(recv) of c+1 saw s's data, which s sends
// after reading call c's rows (and r's in-place expert outputs).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "all_to_all/layout.hpp"
#include "all_to_all/loss_board.hpp"
#include "all_to_all/route.hpp"
#include "backends/all_to_all_backend.hpp"
#include "comm/node_split.hpp"
#include "cpu/reduce.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

static_assert(AllToAllLayout::kSignalWords * sizeof(uint64_t) == SymmetricMemory::kSignalBytes);

class CpuAllToAll final : public AllToAllBackend {
 public:
  CpuAllToAll(Communicator& comm, const AllToAllConfig& config)
      : config_(config),
        layout_(config, comm.size()),
        rank_(comm.rank()),
        world_size_(comm.size()),
        num_local_experts_(config.num_experts / comm.size()),
        rows_per_expert_(int64_t(comm.size()) * config.max_tokens),
        memory_(split_into_nodes(comm.alloc_symmetric(layout_.total_bytes, layout_.signal_slots()),
                                 config.ranks_per_node)),
        header_(layout_.header_bytes / sizeof(int32_t)),
        sent_(world_size_),
        head_(2 + size_t(num_local_experts_)),
        sent_to_expert_(size_t(config.num_experts)),
        received_(num_local_experts_),
        first_row_(size_t(num_local_experts_)) {
    routes_.reserve(size_t(world_size_) * config.max_tokens * layout_.max_pairs);
  }

  void set_routing(const SlotTable&, const std::vector<uint8_t>& live) override { live_ = live; }
  void set_loss_board(LossBoard& board, double backstop_s) override {
    loss_board_ = &board;
    loss_timeout_s_ = backstop_s;
  }
  // Signals only grow: from calls_base + 1 on, what the abandoned calls left reads as stale.
  void restart_at(int64_t calls_base) override { epoch_ = uint64_t(calls_base); }
  std::vector<SymmetricMemory*> symmetric_memory() override { return {memory_.get()}; }

  AllToAll::RemoteTraffic remote_traffic() const override {
    const auto* split = dynamic_cast<const NodeSplitMemory*>(memory_.get());
    if (!split) return {};
    return {split->remote_bytes(), split->remote_transfers()};
  }
  size_t workspace_bytes() const override {
    return layout_.total_bytes + size_t(layout_.signal_slots()) * SymmetricMemory::kSignalBytes +
           header_.capacity() * sizeof(int32_t) + routes_.capacity() * sizeof(Route) +
           (sent_.capacity() + received_.capacity() + head_.capacity() +
            sent_to_expert_.capacity()) * sizeof(int32_t) + first_row_.capacity() * sizeof(int64_t);
  }

  Tensor input_buffer() const override {
    if (!config_.in_place_buffers) return {};
    return Tensor(memory_->local() + layout_.input_offset, config_.in_dtype,
                  {config_.max_tokens, config_.hidden_dim});
  }
  Tensor input_scale_buffer() const override {
    if (!config_.in_place_buffers || config_.in_dtype != DType::f8e4m3) return {};
    return Tensor(memory_->local() + layout_.input_scale_offset, DType::f32,
                  {config_.max_tokens, config_.scales_per_token()});
  }
  Tensor expert_output_buffer() const override {
    if (!config_.in_place_buffers) return {};
    return Tensor(memory_->local() + layout_.expert_output_offset, config_.out_dtype,
                  {num_local_experts_, rows_per_expert_, config_.hidden_dim});
  }

  void dispatch_send(const DispatchArgs& a) override {
    ++epoch_;
    const int k = config_.top_k;
    const size_t payload = layout_.payload_bytes, scales = layout_.scale_bytes;
    const auto* x = static_cast<const std::byte*>(a.x.data());
    const auto* x_scale = static_cast<const std::byte*>(a.x_scale.data());
    const int32_t* indices = a.indices.data<int32_t>();
    // Tokens in this op's input buffer stay there; peers on this node read them in place.
    const bool x_in_place =
        config_.in_place_buffers && x == memory_->local() + layout_.input_offset &&
        (!scales || x_scale == memory_->local() + layout_.input_scale_offset);
    std::fill(sent_.begin(), sent_.end(), 0);
    std::fill(sent_to_expert_.begin(), sent_to_expert_.end(), 0);

    for (int t = 0; t < a.m; ++t) {
      const int32_t* experts = indices + size_t(t) * k;
      // Destinations in ascending rank order; each gets the token once with its expert list.
      for (int dest = next_dest(experts, -1); dest >= 0; dest = next_dest(experts, dest)) {
        int n = 0;
        for (int j = 0; j < k; ++j) {
          if (!first_in_group(experts, j, config_.num_experts, 1) ||
              experts[j] / num_local_experts_ != dest)
            continue;
          header_[size_t(AllToAllLayout::header_expert(n))] = experts[j] % num_local_experts_;
          header_[size_t(AllToAllLayout::header_slot(n))] = j;
          header_[size_t(AllToAllLayout::header_position(n))] = sent_to_expert_[size_t(experts[j])]++;
          ++n;
        }
        header_[AllToAllLayout::kHeaderToken] = t;
        header_[AllToAllLayout::kHeaderPairs] = n;
        const int slot = sent_[dest]++;
        memory_->put(dest, layout_.token_offset(rank_, slot), header_.data(),
                     sizeof(int32_t) * size_t(AllToAllLayout::header_ints(n)));
        if (x_in_place && memory_->peer(dest)) continue;
        memory_->put(dest, layout_.payload_offset(rank_, slot), x + t * payload, payload);
        if (scales)
          memory_->put(dest, layout_.scale_offset(rank_, slot), x_scale + t * scales, scales);
      }
    }
    for (int dest = 0; dest < world_size_; ++dest) {
      if (!live_[size_t(dest)]) continue;
      // The block's head: count, flags, and the rows of each of dest's experts.
      head_[0] = sent_[dest];
      head_[1] = x_in_place && memory_->peer(dest) ? AllToAllLayout::kPayloadInPlace : 0;
      std::copy_n(sent_to_expert_.begin() + ptrdiff_t(dest) * num_local_experts_,
                  num_local_experts_, head_.begin() + 2);
      memory_->put(dest, layout_.count_offset(rank_), head_.data(),
                   head_.size() * sizeof(int32_t));
      memory_->signal(dest, layout_.dispatch_signal(rank_), epoch_);
    }
  }

  void dispatch_recv(const DispatchArgs& a) override {
    const size_t payload = layout_.payload_bytes, scales = layout_.scale_bytes;
    auto* expert_x = static_cast<std::byte*>(a.expert_x.data());
    auto* expert_x_scale = static_cast<std::byte*>(a.expert_x_scale.data());
    const std::byte* region = memory_->local();
    std::fill(received_.begin(), received_.end(), 0);
    routes_.clear();

    // Packed rows: expert e's first row follows every row of experts before e, so every
    // source's head is read first (their expert counts) and the copies start after (set again
    // if the caller asked already: the heads have not changed).
    if (config_.packed_expert_rows) arriving_rows();
    // Sources in rank order, slots in token order: rows come out ordered by (source, token).
    for (int source = 0; source < world_size_; ++source) {
      if (!live_[size_t(source)]) continue;
      wait_for_dispatch(source);
      int32_t count_and_flags[2];
      std::memcpy(count_and_flags, region + layout_.count_offset(source), sizeof count_and_flags);
      const bool in_place = count_and_flags[1] & AllToAllLayout::kPayloadInPlace;
      const std::byte* source_input = in_place ? memory_->peer(source) + layout_.input_offset
                                               : nullptr;
      const std::byte* source_scales =
          in_place ? memory_->peer(source) + layout_.input_scale_offset : nullptr;
      for (int slot = 0; slot < count_and_flags[0]; ++slot) {
        const auto* header =
            reinterpret_cast<const int32_t*>(region + layout_.token_offset(source, slot));
        const int32_t token = header[AllToAllLayout::kHeaderToken];
        const std::byte* row_in = in_place ? source_input + size_t(token) * payload
                                           : region + layout_.payload_offset(source, slot);
        const std::byte* scale_in = in_place ? source_scales + size_t(token) * scales
                                             : region + layout_.scale_offset(source, slot);
        for (int p = 0; p < header[AllToAllLayout::kHeaderPairs]; ++p) {
          const int expert = header[AllToAllLayout::header_expert(p)];
          const int32_t row = int32_t((config_.packed_expert_rows ? first_row_[size_t(expert)]
                                                                  : expert * rows_per_expert_) +
                                      received_[expert]++);
          std::memcpy(expert_x + row * payload, row_in, payload);
          if (scales) std::memcpy(expert_x_scale + row * scales, scale_in, scales);
          routes_.push_back({source, token, header[AllToAllLayout::header_slot(p)], row, slot});
        }
      }
    }
    std::memcpy(a.expert_num_tokens.data(), received_.data(), received_.size() * sizeof(int32_t));
  }

  int64_t arriving_rows() override {
    int64_t next = 0;
    for (int source = 0; source < world_size_; ++source)
      if (live_[size_t(source)]) wait_for_dispatch(source);
    for (int e = 0; e < num_local_experts_; ++e) {
      first_row_[size_t(e)] = next;
      for (int source = 0; source < world_size_; ++source)
        if (live_[size_t(source)]) next += expert_count(source, e);
    }
    return next;
  }

  void combine_send(const CombineArgs& a) override {
    const size_t row_bytes = size_t(config_.hidden_dim) * dtype_size(a.expert_y.dtype());
    const auto* expert_y = static_cast<const std::byte*>(a.expert_y.data());
    // Rows in this op's expert output buffer stay there; peers on this node read them in place.
    const bool y_in_place = config_.in_place_buffers && a.expert_y.dtype() == config_.out_dtype &&
                            expert_y == memory_->local() + layout_.expert_output_offset;
    for (const Route& route : routes_) {
      int32_t row_ref = route.row;
      if (!y_in_place || !memory_->peer(route.source)) {
        memory_->put(route.source, layout_.combine_row_offset(route.token, route.slot),
                     expert_y + route.row * row_bytes, row_bytes);
        row_ref = -1;
      }
      memory_->put(route.source, layout_.row_ref_slot(route.token, route.slot), &row_ref,
                   sizeof row_ref);
    }
    const uint32_t dtype = uint32_t(a.expert_y.dtype());
    for (int dest = 0; dest < world_size_; ++dest) {
      if (!live_[size_t(dest)]) continue;
      memory_->put(dest, layout_.combine_dtype_slot(rank_), &dtype, sizeof dtype);
      memory_->signal(dest, layout_.combine_signal(rank_), epoch_);
    }
  }

  void combine_recv(const CombineArgs& a) override {
    const std::byte* region = memory_->local();
    for (int owner = 0; owner < world_size_; ++owner) {
      if (!live_[size_t(owner)]) continue;
      await(layout_.combine_signal(owner), {"AllToAll::combine(recv)", owner, "its combine rows"});
      uint32_t dtype;
      std::memcpy(&dtype, region + layout_.combine_dtype_slot(owner), sizeof dtype);
      PMOE_CHECK(DType(dtype) == a.expert_y.dtype(), "AllToAll::combine(recv) on rank ", rank_,
                 ": rank ", owner, " sent expert_y as ", dtype_name(DType(dtype)),
                 " but this rank's is ", dtype_name(a.expert_y.dtype()),
                 "; every rank must pass the same expert_y dtype");
    }
    visit_float_dtype(a.expert_y.dtype(), [&](auto in_tag) {
      visit_float_dtype(a.y.dtype(), [&](auto out_tag) {
        reduce_rows<decltype(in_tag), decltype(out_tag)>(a);
      });
    });
  }

 private:
  void wait_for_dispatch(int source) {
    await(layout_.dispatch_signal(source),
          {"AllToAll::dispatch(recv)", source, "its dispatch data"});
  }
  // Waits for this call's `slot` signal; with a loss watch, a lost peer ends the wait.
  void await(int slot, const WaitFor& what) {
    if (!loss_board_) return memory_->wait_signal(slot, epoch_, what);
    std::optional<std::chrono::steady_clock::time_point> since;  // the first poll after the spin
    memory_->wait_signal(slot, epoch_, what, [&] {
      if (!since) since = std::chrono::steady_clock::now();
      loss_board_->watch(what.peer, *since, live_);
    }, loss_timeout_s_);
  }
  // Rows of local expert e that `source` sent this call (its block head; after its signal).
  int32_t expert_count(int source, int e) const {
    int32_t count;
    std::memcpy(&count, memory_->local() + layout_.expert_count_offset(source, e), sizeof count);
    return count;
  }

  // The smallest rank above `after` that owns one of the experts in `experts` [k], or -1.
  int next_dest(const int32_t* experts, int after) const {
    int best = -1;
    for (int j = 0; j < config_.top_k; ++j) {
      if (!first_in_group(experts, j, config_.num_experts, num_local_experts_)) continue;
      const int owner = experts[j] / num_local_experts_;
      if (owner > after && (best < 0 || owner < best)) best = owner;
    }
    return best;
  }

  // y[t] = sum_j weights[t, j] * row(t, j), in f32, in j order, then rounded once to Out. A row
  // is read in place from its owner's expert output buffer, or from this rank's combine area.
  template <typename In, typename Out>
  void reduce_rows(const CombineArgs& a) {
    if constexpr (std::is_same_v<In, f8e4m3> || std::is_same_v<Out, f8e4m3>) {
      throw Error("AllToAll::combine: f8e4m3 expert_y or y");  // rejected by validation
    } else {
      const int k = config_.top_k;
      const int64_t H = config_.hidden_dim;
      const int32_t* indices = a.indices.data<int32_t>();
      const float* weights = a.weights.data<float>();
      const std::byte* region = memory_->local();
      std::vector<const In*> rows(static_cast<size_t>(k));
      std::vector<float> row_weights(static_cast<size_t>(k));
      for (int t = 0; t < a.m; ++t) {
        int n = 0;
        for (int j = 0; j < k; ++j) {
          const int32_t expert = indices[t * k + j];
          if (!first_in_group(indices + t * k, j, config_.num_experts, 1)) continue;
          int32_t row_ref;
          std::memcpy(&row_ref, region + layout_.row_ref_slot(t, j), sizeof row_ref);
          const std::byte* row =
              row_ref >= 0 ? memory_->peer(expert / num_local_experts_) +
                                 layout_.expert_output_offset + size_t(row_ref) * H * sizeof(In)
                           : region + layout_.combine_row_offset(t, j);
          rows[size_t(n)] = reinterpret_cast<const In*>(row);
          row_weights[size_t(n)] = weights[t * k + j];
          ++n;
        }
        cpu::weighted_sum(a.y.data<Out>() + t * H, rows.data(), row_weights.data(), n, H);
      }
    }
  }

  AllToAllConfig config_;
  AllToAllLayout layout_;
  int rank_, world_size_, num_local_experts_;
  int64_t rows_per_expert_;
  std::unique_ptr<SymmetricMemory> memory_;
  uint64_t epoch_ = 0;              // calls so far; every signal carries the current one
  std::vector<int32_t> header_;     // staging for one token's header
  std::vector<int32_t> sent_;       // tokens sent to each rank this call
  std::vector<int32_t> head_;       // staging for one source block's head
  std::vector<int32_t> sent_to_expert_;  // rows sent to each (global) expert this call
  std::vector<int32_t> received_;   // rows received per local expert this call
  std::vector<int64_t> first_row_;  // packed_expert_rows: each local expert's first row
  std::vector<Route> routes_;       // this call's received rows, for combine
  std::vector<uint8_t> live_;       // ranks not masked (AllToAll::mask_rank)
  LossBoard* loss_board_ = nullptr;  // on_peer_loss = mask: ends a wait on a lost peer
  double loss_timeout_s_ = 0;
};

}  // namespace

std::unique_ptr<AllToAllBackend> make_cpu_all_to_all(Communicator& comm,
                                                      const AllToAllConfig& config) {
  // The relay protocol lives in the CUDA kernels only; the CPU backend's off-node path is MPI's.
  PMOE_CHECK(!config.combine_sums_in_node, "AllToAll on the CPU: combine_sums_in_node (with "
             "cross_node = hierarchical) is a mode of the CUDA backend; leave it false here");
  PMOE_CHECK(config.cross_node == CrossNode::direct, "AllToAll on the CPU: cross_node = "
             "hierarchical is a mode of the CUDA backend; use CrossNode::direct here");
  return std::make_unique<CpuAllToAll>(comm, config);
}

}  // namespace pmoe::detail
