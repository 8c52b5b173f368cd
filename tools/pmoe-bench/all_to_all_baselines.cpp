#include "all_to_all_baselines.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "byte_all_to_all.hpp"
#include "cpu/reduce.hpp"
#include "pmoe/error.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::bench {
namespace {

using reference::AllToAllInputs;

// What every baseline shares: the shape, this rank's inputs, and the weighted sum at the source.
struct Common {
  Common(Communicator& comm, const AllToAllConfig& config, const AllToAllInputs& inputs)
      : comm(comm),
        cfg(config),
        in(inputs),
        W(comm.size()),
        rank(comm.rank()),
        k(config.top_k),
        E_local(config.num_experts / comm.size()),
        H(config.hidden_dim),
        S(config.scales_per_token()),
        payload_bytes(size_t(H) * dtype_size(config.in_dtype)),
        row_bytes(payload_bytes + sizeof(float) * S),  // payload and its scales travel together
        y_row_bytes(size_t(H) * sizeof(bf16)),
        y(config.out_dtype, {inputs.m, config.hidden_dim}) {}

  // Copies token t's payload and scales into `to` (row_bytes).
  void pack_token(int t, std::byte* to) const {
    std::memcpy(to, in.x.data<std::byte>() + size_t(t) * payload_bytes, payload_bytes);
    if (S) std::memcpy(to + payload_bytes, in.x_scale.data<float>() + size_t(t) * S, sizeof(float) * S);
  }

  // The stand-in expert `expert` on one packed row, into a bf16 output row.
  void expert_row(const std::byte* row, int expert, std::byte* out) const {
    reference::fake_expert_row(cfg, row, S ? reinterpret_cast<const float*>(row + payload_bytes) : nullptr,
                               expert, DType::bf16, out);
  }

  // y[t] = sum_j weights[t, j] * (bf16 row of (t, j)), in j order, with AllToAll::combine's
  // own reduction kernel, so that only the data movement differs.
  template <typename RowOf>
  void reduce(RowOf&& row_of) {
    const int32_t* idx = in.indices.data<int32_t>();
    const float* w = in.weights.data<float>();
    std::vector<const bf16*> rows(static_cast<size_t>(k));
    std::vector<float> weights(static_cast<size_t>(k));
    for (int t = 0; t < in.m; ++t) {
      int n = 0;
      for (int j = 0; j < k; ++j) {
        if (idx[t * k + j] < 0) continue;
        rows[size_t(n)] = reinterpret_cast<const bf16*>(row_of(t, j));
        weights[size_t(n++)] = w[t * k + j];
      }
      visit_float_dtype(cfg.out_dtype, [&](auto tag) {
        using Out = decltype(tag);
        if constexpr (!std::is_same_v<Out, f8e4m3>)
          cpu::weighted_sum(y.data<Out>() + size_t(t) * H, rows.data(), weights.data(), n, H);
      });
    }
  }

  std::string check_y() const {
    return reference::compare_bytes("y", y, reference::reference_combine(cfg, in, DType::bf16));
  }

  Communicator& comm;
  const AllToAllConfig cfg;
  const AllToAllInputs& in;
  const int W, rank, k, E_local, H, S;
  const size_t payload_bytes, row_bytes, y_row_bytes;
  Buffer y;
};

class AlltoallvPath final : public BaselinePath {
 public:
  AlltoallvPath(Communicator& comm, const AllToAllConfig& config, const AllToAllInputs& inputs)
      : c_(comm, config, inputs),
        rows_per_expert_(int64_t(c_.W) * config.max_tokens),
        forward_(comm, size_t(config.max_tokens) * c_.k * c_.row_bytes),
        backward_(comm, size_t(rows_per_expert_) * std::min(c_.k, c_.E_local) * c_.y_row_bytes),
        recv_(size_t(rows_per_expert_) * std::min(c_.k, c_.E_local) * c_.row_bytes),
        back_(size_t(config.max_tokens) * c_.k * c_.y_row_bytes),
        position_(size_t(inputs.m) * c_.k, -1) {
    expert_rows_.resize(size_t(c_.E_local) * rows_per_expert_ * c_.row_bytes);
    expert_y_.resize(size_t(c_.E_local) * rows_per_expert_ * c_.y_row_bytes);
  }

  void dispatch() override {
    const int W = c_.W, E = c_.cfg.num_experts, k = c_.k, E_local = c_.E_local;
    const int32_t* idx = c_.in.indices.data<int32_t>();
    // Sort the (token, slot) rows by expert, stably in token order: a counting sort.
    std::vector<int64_t> per_expert(size_t(E), 0);
    for (int i = 0; i < c_.in.m * k; ++i)
      if (idx[i] >= 0) ++per_expert[size_t(idx[i])];
    std::vector<int64_t> start(size_t(E) + 1, 0);
    for (int e = 0; e < E; ++e) start[size_t(e) + 1] = start[size_t(e)] + per_expert[size_t(e)];
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    std::byte* send = forward_.send_buffer();
    for (int t = 0; t < c_.in.m; ++t) {
      for (int j = 0; j < k; ++j) {
        const int e = idx[t * k + j];
        if (e < 0) continue;
        const int64_t pos = next[size_t(e)]++;
        position_[size_t(t) * k + j] = pos;
        c_.pack_token(t, send + size_t(pos) * c_.row_bytes);
      }
    }
    // Exchange the per-(rank, local expert) counts, then the rows.
    received_ = exchange_counts(c_.comm, per_expert, E_local);  // [source][local expert]
    std::vector<size_t> send_counts(W), send_displs(W), recv_counts(W), recv_displs(W);
    size_t recv_total = 0;
    for (int d = 0; d < W; ++d) {
      send_displs[d] = size_t(start[size_t(d) * E_local]) * c_.row_bytes;
      send_counts[d] = size_t(start[size_t(d + 1) * E_local] - start[size_t(d) * E_local]) * c_.row_bytes;
      int64_t rows = 0;
      for (int e = 0; e < E_local; ++e) rows += received_[size_t(d) * E_local + e];
      recv_displs[d] = recv_total;
      recv_counts[d] = size_t(rows) * c_.row_bytes;
      recv_total += recv_counts[d];
    }
    forward_.exchange(send_counts, send_displs, recv_.data(), recv_counts, recv_displs);
    // Regroup per local expert, ordered by (source, token): the layout AllToAll produces.
    size_t offset = 0;
    expert_count_.assign(size_t(E_local), 0);
    for (int s = 0; s < W; ++s) {
      for (int e = 0; e < E_local; ++e) {
        for (int64_t i = 0; i < received_[size_t(s) * E_local + e]; ++i) {
          const size_t row = size_t(e) * rows_per_expert_ + size_t(expert_count_[size_t(e)]++);
          std::memcpy(expert_rows_.data() + row * c_.row_bytes, recv_.data() + offset, c_.row_bytes);
          offset += c_.row_bytes;
        }
      }
    }
  }

  void run_experts() override {
    for (int e = 0; e < c_.E_local; ++e)
      for (int64_t i = 0; i < expert_count_[size_t(e)]; ++i) {
        const size_t row = size_t(e) * rows_per_expert_ + size_t(i);
        c_.expert_row(expert_rows_.data() + row * c_.row_bytes, c_.rank * c_.E_local + e,
                      expert_y_.data() + row * c_.y_row_bytes);
      }
  }

  void combine() override {
    const int W = c_.W, E_local = c_.E_local;
    // Pack the expert outputs back in the order they came: (source, local expert, token).
    std::byte* send = backward_.send_buffer();
    std::vector<int64_t> taken(size_t(E_local), 0);
    std::vector<size_t> send_counts(W), send_displs(W), recv_counts(W), recv_displs(W);
    size_t packed = 0;
    for (int s = 0; s < W; ++s) {
      send_displs[s] = packed;
      for (int e = 0; e < E_local; ++e) {
        for (int64_t i = 0; i < received_[size_t(s) * E_local + e]; ++i) {
          const size_t row = size_t(e) * rows_per_expert_ + size_t(taken[size_t(e)]++);
          std::memcpy(send + packed, expert_y_.data() + row * c_.y_row_bytes, c_.y_row_bytes);
          packed += c_.y_row_bytes;
        }
      }
      send_counts[s] = packed - send_displs[s];
    }
    // What comes back is this rank's rows in the sorted order it sent them.
    const int32_t* idx = c_.in.indices.data<int32_t>();
    size_t total = 0;
    for (int d = 0; d < W; ++d) {
      int64_t rows = 0;
      for (int i = 0; i < c_.in.m * c_.k; ++i) rows += idx[i] >= 0 && idx[i] / E_local == d;
      recv_displs[d] = total;
      recv_counts[d] = size_t(rows) * c_.y_row_bytes;
      total += recv_counts[d];
    }
    backward_.exchange(send_counts, send_displs, back_.data(), recv_counts, recv_displs);
    c_.reduce([&](int t, int j) {
      return back_.data() + size_t(position_[size_t(t) * c_.k + j]) * c_.y_row_bytes;
    });
  }

  std::string check(const std::vector<AllToAllInputs>& all) override {
    const auto expected = reference::reference_dispatch(c_.cfg, c_.W, c_.rank, all);
    for (int e = 0; e < c_.E_local; ++e) {
      if (expert_count_[size_t(e)] != expected.counts[size_t(e)])
        return "alltoallv: wrong row count at local expert " + std::to_string(e);
      for (int64_t i = 0; i < expert_count_[size_t(e)]; ++i) {
        const std::byte* row = expert_rows_.data() + (size_t(e) * rows_per_expert_ + size_t(i)) * c_.row_bytes;
        if (std::memcmp(row, expected.rows[size_t(e)].data() + size_t(i) * c_.payload_bytes,
                        c_.payload_bytes) != 0)
          return "alltoallv: wrong row " + std::to_string(i) + " at local expert " + std::to_string(e);
      }
    }
    return c_.check_y();
  }

 private:
  Common c_;
  int64_t rows_per_expert_;
  ByteAllToAllV forward_, backward_;
  std::vector<std::byte> recv_, back_, expert_rows_, expert_y_;
  std::vector<int64_t> position_;       // (t, j) -> its row in the sorted send order
  std::vector<int64_t> received_;       // [source][local expert] rows received
  std::vector<int64_t> expert_count_;   // rows per local expert
};

class DensePaddedPath final : public BaselinePath {
 public:
  DensePaddedPath(Communicator& comm, const AllToAllConfig& config, const AllToAllInputs& inputs)
      : c_(comm, config, inputs),
        max_(config.max_tokens),
        block_rows_(size_t(c_.E_local) * max_),
        forward_(comm, size_t(c_.W) * block_rows_ * c_.row_bytes),
        backward_(comm, size_t(c_.W) * block_rows_ * c_.y_row_bytes),
        recv_(size_t(c_.W) * block_rows_ * c_.row_bytes),
        back_(size_t(c_.W) * block_rows_ * c_.y_row_bytes),
        slot_(size_t(inputs.m) * c_.k, -1) {}

  void dispatch() override {
    const int E = c_.cfg.num_experts, k = c_.k;
    const int32_t* idx = c_.in.indices.data<int32_t>();
    std::vector<int64_t> per_expert(size_t(E), 0);
    std::byte* send = forward_.send_buffer();  // [dest][local expert][max_tokens] rows, padded
    for (int t = 0; t < c_.in.m; ++t) {
      for (int j = 0; j < k; ++j) {
        const int e = idx[t * k + j];
        if (e < 0) continue;
        const int64_t slot = per_expert[size_t(e)]++;
        slot_[size_t(t) * k + j] = slot;
        c_.pack_token(t, send + (size_t(e) * max_ + size_t(slot)) * c_.row_bytes);
      }
    }
    received_ = exchange_counts(c_.comm, per_expert, c_.E_local);
    exchange_all(forward_, recv_.data(), c_.row_bytes);
  }

  void run_experts() override {
    const size_t S_rows = block_rows_;
    for (int s = 0; s < c_.W; ++s)
      for (int e = 0; e < c_.E_local; ++e)
        for (int64_t i = 0; i < received_[size_t(s) * c_.E_local + e]; ++i) {
          const size_t row = size_t(s) * S_rows + size_t(e) * max_ + size_t(i);
          c_.expert_row(recv_.data() + row * c_.row_bytes, c_.rank * c_.E_local + e,
                        backward_.send_buffer() + row * c_.y_row_bytes);
        }
  }

  void combine() override {
    exchange_all(backward_, back_.data(), c_.y_row_bytes);
    const int32_t* idx = c_.in.indices.data<int32_t>();
    c_.reduce([&](int t, int j) {
      const size_t e = size_t(idx[t * c_.k + j]);  // global expert: block (owner, local expert)
      return back_.data() + (e * max_ + size_t(slot_[size_t(t) * c_.k + j])) * c_.y_row_bytes;
    });
  }

  std::string check(const std::vector<AllToAllInputs>&) override { return c_.check_y(); }

 private:
  // Every rank sends every other rank its whole [E_local, max_tokens] block, padding included.
  void exchange_all(ByteAllToAllV& exchange, std::byte* recv, size_t row_bytes) {
    std::vector<size_t> counts(c_.W, block_rows_ * row_bytes), displs(c_.W);
    for (int r = 0; r < c_.W; ++r) displs[r] = size_t(r) * block_rows_ * row_bytes;
    exchange.exchange(counts, displs, recv, counts, displs);
  }

  Common c_;
  size_t max_, block_rows_;
  ByteAllToAllV forward_, backward_;
  std::vector<std::byte> recv_, back_;
  std::vector<int64_t> slot_;      // (t, j) -> its slot in the expert's padded block
  std::vector<int64_t> received_;  // [source][local expert] valid rows
};

}  // namespace

std::unique_ptr<BaselinePath> make_alltoallv_path(Communicator& comm, const AllToAllConfig& config,
                                                  const AllToAllInputs& inputs) {
  return std::make_unique<AlltoallvPath>(comm, config, inputs);
}

std::unique_ptr<BaselinePath> make_dense_padded_path(Communicator& comm,
                                                     const AllToAllConfig& config,
                                                     const AllToAllInputs& inputs) {
  return std::make_unique<DensePaddedPath>(comm, config, inputs);
}

}  // namespace pmoe::bench
