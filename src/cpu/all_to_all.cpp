// AllToAll on the CPU backend: plain copies into peers' symmetric regions, epoch signals, and a
// receive side that lays rows out per expert. The buffer layout is drawn in all_to_all_layout.hpp.
//
// Why buffers can be reused without a barrier: source s writes block s of rank r for call c+1
// only after its combine(recv) of call c, which waited for r's combine signal, which r sends only
// after it finished reading block s of call c. Symmetrically, r writes s's combine rows for call
// c+1 only after its dispatch(recv) of c+1 saw s's data, which s sends after reading call c's rows.
#include <cstring>
#include <vector>

#include "all_to_all/backend.hpp"
#include "cpu/all_to_all_layout.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

// One (token, local expert) row received by this rank; combine sends it back along this route.
struct Route {
  int32_t source;     // rank the token came from
  int32_t token;      // its index at the source
  int32_t slot;       // top-k slot j at the source
  int32_t row;        // flat row index e * rows_per_expert + position, in expert_x / expert_y
};

class CpuAllToAll final : public AllToAllBackend {
 public:
  CpuAllToAll(Communicator& comm, const AllToAllConfig& config)
      : config_(config),
        layout_(config, comm.size()),
        rank_(comm.rank()),
        world_size_(comm.size()),
        num_local_experts_(config.num_experts / comm.size()),
        rows_per_expert_(int64_t(comm.size()) * config.max_num_tokens),
        memory_(comm.alloc_symmetric(layout_.total_bytes, layout_.signal_slots())),
        header_(layout_.header_bytes / sizeof(int32_t)),
        sent_(world_size_),
        received_(num_local_experts_) {
    routes_.reserve(size_t(world_size_) * config.max_num_tokens * layout_.max_pairs);
  }

  size_t workspace_bytes() const override {
    return layout_.total_bytes + size_t(layout_.signal_slots()) * 64 +
           header_.capacity() * sizeof(int32_t) + routes_.capacity() * sizeof(Route) +
           (sent_.capacity() + received_.capacity()) * sizeof(int32_t);
  }

  void dispatch_send(const DispatchArgs& a) override {
    ++epoch_;
    const int k = config_.experts_per_token;
    const size_t payload = size_t(config_.hidden_dim) * dtype_size(config_.in_dtype);
    const size_t scales = sizeof(float) * size_t(config_.scales_per_token());
    const auto* x = static_cast<const std::byte*>(a.x.data());
    const auto* x_scale = static_cast<const std::byte*>(a.x_scale.data());
    const int32_t* indices = a.indices.data<int32_t>();
    std::fill(sent_.begin(), sent_.end(), 0);

    for (int t = 0; t < a.m; ++t) {
      const int32_t* experts = indices + size_t(t) * k;
      // Destinations in ascending rank order; each gets the token once with its expert list.
      for (int dest = next_dest(experts, -1); dest >= 0; dest = next_dest(experts, dest)) {
        int n = 0;
        for (int j = 0; j < k; ++j) {
          if (experts[j] < 0 || experts[j] / num_local_experts_ != dest) continue;
          header_[2 + 2 * n] = experts[j] % num_local_experts_;
          header_[3 + 2 * n] = j;
          ++n;
        }
        header_[0] = t;
        header_[1] = n;
        const int slot = sent_[dest]++;
        memory_->put(dest, layout_.token_offset(rank_, slot), header_.data(),
                     sizeof(int32_t) * (2 + 2 * size_t(n)));
        memory_->put(dest, layout_.payload_offset(rank_, slot), x + t * payload, payload);
        if (scales)
          memory_->put(dest, layout_.scale_offset(rank_, slot), x_scale + t * scales, scales);
      }
    }
    for (int dest = 0; dest < world_size_; ++dest) {
      memory_->put(dest, layout_.count_offset(rank_), &sent_[dest], sizeof(int32_t));
      memory_->signal(dest, layout_.dispatch_signal(rank_), epoch_);
    }
  }

  void dispatch_recv(const DispatchArgs& a) override {
    const size_t payload = size_t(config_.hidden_dim) * dtype_size(config_.in_dtype);
    const size_t scales = sizeof(float) * size_t(config_.scales_per_token());
    auto* expert_x = static_cast<std::byte*>(a.expert_x.data());
    auto* expert_x_scale = static_cast<std::byte*>(a.expert_x_scale.data());
    const std::byte* region = memory_->local();
    std::fill(received_.begin(), received_.end(), 0);
    routes_.clear();

    // Sources in rank order, slots in token order: rows come out ordered by (source, token).
    for (int source = 0; source < world_size_; ++source) {
      memory_->wait_signal(layout_.dispatch_signal(source), epoch_,
                           {"AllToAll::dispatch(recv)", source, "its dispatch data"});
      int32_t count;
      std::memcpy(&count, region + layout_.count_offset(source), sizeof count);
      for (int slot = 0; slot < count; ++slot) {
        const auto* header =
            reinterpret_cast<const int32_t*>(region + layout_.token_offset(source, slot));
        const std::byte* row_in = region + layout_.payload_offset(source, slot);
        const std::byte* scale_in = region + layout_.scale_offset(source, slot);
        for (int p = 0; p < header[1]; ++p) {
          const int expert = header[2 + 2 * p];
          const int32_t row = int32_t(expert * rows_per_expert_ + received_[expert]++);
          std::memcpy(expert_x + row * payload, row_in, payload);
          if (scales) std::memcpy(expert_x_scale + row * scales, scale_in, scales);
          routes_.push_back({source, header[0], header[3 + 2 * p], row});
        }
      }
    }
    std::memcpy(a.expert_num_tokens.data(), received_.data(), received_.size() * sizeof(int32_t));
  }

  void combine_send(const CombineArgs& a) override {
    const size_t row_bytes = size_t(config_.hidden_dim) * dtype_size(a.expert_y.dtype());
    const auto* expert_y = static_cast<const std::byte*>(a.expert_y.data());
    for (const Route& route : routes_) {
      memory_->put(route.source, layout_.combine_row_offset(route.token, route.slot),
                   expert_y + route.row * row_bytes, row_bytes);
    }
    for (int dest = 0; dest < world_size_; ++dest)
      memory_->signal(dest, layout_.combine_signal(rank_), epoch_);
  }

  void combine_recv(const CombineArgs& a) override {
    for (int source = 0; source < world_size_; ++source)
      memory_->wait_signal(layout_.combine_signal(source), epoch_,
                           {"AllToAll::combine(recv)", source, "its combine rows"});
    visit_float_dtype(a.expert_y.dtype(), [&](auto in_tag) {
      visit_float_dtype(a.y.dtype(), [&](auto out_tag) {
        reduce_rows<decltype(in_tag), decltype(out_tag)>(a);
      });
    });
  }

 private:
  // The smallest rank above `after` that owns one of the experts in `experts` [k], or -1.
  int next_dest(const int32_t* experts, int after) const {
    int best = -1;
    for (int j = 0; j < config_.experts_per_token; ++j) {
      if (experts[j] < 0) continue;
      const int owner = experts[j] / num_local_experts_;
      if (owner > after && (best < 0 || owner < best)) best = owner;
    }
    return best;
  }

  // y[t] = sum_j weights[t, j] * row(t, j), in f32, in j order, then rounded once to Out.
  template <typename In, typename Out>
  void reduce_rows(const CombineArgs& a) {
    const int k = config_.experts_per_token;
    const int64_t H = config_.hidden_dim;
    const int32_t* indices = a.indices.data<int32_t>();
    const float* weights = a.weights.data<float>();
    Out* y = a.y.data<Out>();
    const std::byte* region = memory_->local();
    accumulator_.resize(size_t(H));
    float* acc = accumulator_.data();
    for (int t = 0; t < a.m; ++t) {
      std::fill(acc, acc + H, 0.0f);
      for (int j = 0; j < k; ++j) {
        if (indices[t * k + j] < 0) continue;
        const float w = weights[t * k + j];
        const auto* row = reinterpret_cast<const In*>(region + layout_.combine_row_offset(t, j));
        for (int64_t h = 0; h < H; ++h) acc[h] += w * to_float(row[h]);
      }
      for (int64_t h = 0; h < H; ++h) y[t * H + h] = from_float<Out>(acc[h]);
    }
  }

  AllToAllConfig config_;
  AllToAllLayout layout_;
  int rank_, world_size_, num_local_experts_;
  int64_t rows_per_expert_;
  std::unique_ptr<SymmetricMemory> memory_;
  uint64_t epoch_ = 0;                 // calls so far; every signal carries the current one
  std::vector<int32_t> header_;        // staging for one token's header
  std::vector<int32_t> sent_;          // tokens sent to each rank this call
  std::vector<int32_t> received_;      // rows received per local expert this call
  std::vector<Route> routes_;          // this call's received rows, for combine
  std::vector<float> accumulator_;     // one f32 row for combine's reduction
};

}  // namespace

std::unique_ptr<AllToAllBackend> make_cpu_all_to_all(Communicator& comm,
                                                      const AllToAllConfig& config) {
  return std::make_unique<CpuAllToAll>(comm, config);
}

}  // namespace pmoe::detail
