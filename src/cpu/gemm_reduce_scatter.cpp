// GemmReduceScatter on the CPU backend.
//
// Symmetric memory on every rank: W receive slots of [M/W, N] in the op's dtype.
//   all-pairs: slot s holds rank s's partial product for this rank's block;
//   ring:      slot b holds the running sum for block b that rank r+1 forwards here.
//
//   recv      | slot 0 | slot 1 | ... | slot W-1 |
//   partial   [M, N] f32, private: A_r . B_r, written piece by piece by this thread
//
// run(): this thread multiplies the pieces in reduce_scatter_steps order (own block last) into
// `partial` and publishes its progress; the worker takes each piece once it is multiplied and
// either writes it, rounded to the dtype, to its block's owner (all-pairs), or adds it to what
// came from rank r+1 and forwards the sum to rank r-1 (ring). For its own block the worker sums
// the arrivals (while the GEMM of the piece still runs) and then its own piece into C. Sums run
// in f32 in the order ranks b-1, b-2, ..., b+1, then b, whatever the order option. Pieces go
// straight into a reachable peer's memory; `staging` holds them rounded for an MPI put.
#include <algorithm>
#include <vector>

#include "cpu/gemm.hpp"
#include "cpu/overlap_base.hpp"
#include "cpu/overlap_rows.hpp"

namespace pmoe::detail {
namespace {

class CpuGemmReduceScatter final : public CpuOverlapBase {
 public:
  CpuGemmReduceScatter(Communicator& comm, const OverlapConfig& config)
      : CpuOverlapBase(comm, config, size_t(config.m * config.n) * size_t(dtype_size(config.dtype)),
                       size_t((comm.size() - 1) * (config.m / comm.size()) * config.n) *
                           size_t(dtype_size(config.dtype))),
        k_local_(config.k / comm.size()),
        steps_(reduce_scatter_steps(rank_, layout_)),
        partial_(size_t(config.m * config.n)),
        sum_(size_t(layout_.block_rows() * config.n)),
        staging_(size_t(layout_.block_rows() * config.n) * dsize_) {
    if (config_.dtype != DType::f32) {
      a32_.resize(size_t(config_.m * k_local_));
      b32_.resize(size_t(k_local_ * config_.n));
    }
  }

  size_t workspace_bytes() const override {
    return base_workspace_bytes() +
           (partial_.size() + sum_.size() + a32_.size() + b32_.size()) * sizeof(float) +
           staging_.size();
  }

  void run(const OverlapArgs& args) override {
    begin_call();
    if (!worker_) {
      prepare_b(args);
      for (const PieceStep& s : steps_) {
        multiply(args, s);  // first: a ring's arrival comes after the sender's GEMM of the step
        gather_arrivals(s, /*on_worker=*/false);
        finish_piece(args, s, /*on_worker=*/false);
      }
      return;
    }
    pipeline(
        [&] {
          for (size_t i = 0; i < steps_.size(); ++i) {
            gather_arrivals(steps_[i], /*on_worker=*/true);
            worker_->wait_progress(int(i) + 1, kRun);
            finish_piece(args, steps_[i], /*on_worker=*/true);
          }
        },
        [&] {
          prepare_b(args);
          for (size_t i = 0; i < steps_.size(); ++i) {
            multiply(args, steps_[i]);
            worker_->publish(int(i) + 1);
          }
        });
  }

  void run_serial(const OverlapArgs& args, SerialStep step) override {
    if (step != SerialStep::communicate) multiply_all(args);
    if (step != SerialStep::gemm) reduce_scatter(args);
  }

  void run_gemm_only(const OverlapArgs& args) override {
    prepare_b(args);
    for (const PieceStep& s : steps_) multiply(args, s);
  }

 private:
  static constexpr const char* kRun = "GemmReduceScatter::run";
  static constexpr const char* kSerial = "GemmReduceScatter::run_serial(communicate)";

  int64_t row_elems(int64_t rows) const { return rows * config_.n; }
  // Byte offset of row `row_in_block` of receive slot `slot`.
  size_t slot_offset(int slot, int64_t row_in_block) const {
    return size_t(row_elems(int64_t(slot) * layout_.block_rows() + row_in_block)) * dsize_;
  }
  const std::byte* slot_rows(int slot, int64_t row_in_block) const {
    return memory_->local() + slot_offset(slot, row_in_block);
  }

  // partial rows of piece s = (A rows) . B.
  void multiply(const OverlapArgs& args, const PieceStep& s) {
    const int64_t rows = layout_.piece_rows(s.piece), row = layout_.row(s.block, s.piece);
    gemm_rows(args, row, rows);
  }

  void gemm_rows(const OverlapArgs& args, int64_t row, int64_t rows) {
    const int64_t N = config_.n, Kl = k_local_;
    const float* a;
    const float* b;
    if (config_.dtype == DType::f32) {
      a = args.A.data<float>() + row * Kl;
      b = args.B.data<float>();
    } else {
      float* a32 = a32_.data() + row * Kl;
      widen(config_.dtype, static_cast<const std::byte*>(args.A.data()) + size_t(row * Kl) * dsize_,
            a32, rows * Kl);
      a = a32;
      b = b32_.data();
    }
    cpu::gemm_f32(int(rows), int(N), int(Kl), a, int(Kl), b, int(N), partial_.data() + row * N,
                  int(N));
  }

  void prepare_b(const OverlapArgs& args) {
    if (config_.dtype != DType::f32)
      widen(config_.dtype, args.B.data(), b32_.data(), k_local_ * config_.n);
  }

  // What happens to piece s (see the file comment), in two halves. gather_arrivals() needs only
  // what peers sent: it waits for their pieces and folds them into `sum_` (nothing when the
  // piece only leaves). finish_piece() needs this rank's product of the piece: it adds it and
  // sends the result on, or rounds it into C. The worker runs the first half while the GEMM
  // is still going. Either way the f32 sums run in the same order.
  void gather_arrivals(const PieceStep& s, bool on_worker) {
    const int64_t begin = layout_.piece_begin(s.piece),
                  count = row_elems(layout_.piece_rows(s.piece));
    const uint64_t arrived = layout_.piece_signal(call_, s.piece);
    float* sum = sum_.data() + row_elems(begin);
    if (config_.order == OverlapOrder::ring) {
      if (s.step == 0) return;  // the chain of block b starts here
      const int next = ring_index(rank_ + 1, world_size_);
      wait_signal(layout_.arrival_slot(s.block), arrived, {kRun, next, "a running sum to add to"},
                  on_worker);
      widen(config_.dtype, slot_rows(s.block, begin), sum, count);  // ranks b-1 .. r+1
      return;
    }
    if (s.block != rank_) return;
    std::fill(sum, sum + count, 0.0f);
    for (int i = 1; i < world_size_; ++i) {  // sources b-1, b-2, ..., b+1
      const int source = ring_index(rank_ - i, world_size_);
      wait_signal(layout_.arrival_slot(source), arrived, {kRun, source, "its partial product"},
                  on_worker);
      accumulate(sum, config_.dtype, slot_rows(source, begin), count);
    }
  }

  void finish_piece(const OverlapArgs& args, const PieceStep& s, bool on_worker) {
    const int64_t begin = layout_.piece_begin(s.piece),
                  count = row_elems(layout_.piece_rows(s.piece));
    const float* mine = partial_.data() + row_elems(layout_.row(s.block, s.piece));
    float* sum = sum_.data() + row_elems(begin);
    const bool ring = config_.order == OverlapOrder::ring;
    const bool has_arrivals = ring ? s.step > 0 : s.block == rank_;
    if (has_arrivals) accumulate(sum, mine, count);
    const float* total = has_arrivals ? sum : mine;
    if (s.block == rank_) {
      narrow(total, config_.dtype, c_rows(args, begin), count);
      return;
    }
    const int dest = ring ? ring_index(rank_ - 1, world_size_) : s.block;
    const int slot = ring ? s.block : rank_;
    wait_ready(dest, kRun, on_worker);
    put_rounded(dest, slot_offset(slot, begin), total, count);
    memory_->signal(dest, layout_.arrival_slot(slot), layout_.piece_signal(call_, s.piece));
  }

  std::byte* c_rows(const OverlapArgs& args, int64_t row) const {
    return static_cast<std::byte*>(args.C.data()) + size_t(row_elems(row)) * dsize_;
  }

  // Writes `count` f32 values, rounded to the op's dtype, into rank `dest`'s memory at `offset`:
  // straight into it where it is load/store reachable, else through staging and a put.
  void put_rounded(int dest, size_t offset, const float* values, int64_t count) {
    if (std::byte* peer = memory_->peer(dest)) {
      narrow(values, config_.dtype, peer + offset, count);
      return;
    }
    const void* payload = values;
    if (config_.dtype != DType::f32) {
      narrow(values, config_.dtype, staging_.data(), count);
      payload = staging_.data();
    }
    memory_->put(dest, offset, payload, size_t(count) * dsize_);
  }

  // The baseline's GEMM: all M rows at once.
  void multiply_all(const OverlapArgs& args) {
    prepare_b(args);
    gemm_rows(args, 0, config_.m);
  }

  // The baseline's collective: each block of the partial product to its owner directly, then
  // the sum of the arrivals and the own block, in the same order as run().
  void reduce_scatter(const OverlapArgs& args) {
    begin_call();
    const int64_t count = row_elems(layout_.block_rows());
    for (int s = 0; s + 1 < world_size_; ++s) {
      const int dest = ring_index(rank_ + 1 + s, world_size_);
      wait_ready(dest, kSerial, /*on_worker=*/false);
      put_rounded(dest, slot_offset(rank_, 0),
                  partial_.data() + row_elems(int64_t(dest) * layout_.block_rows()), count);
      memory_->signal(dest, layout_.arrival_slot(rank_), layout_.block_signal(call_));
    }
    std::fill(sum_.begin(), sum_.end(), 0.0f);
    for (int i = 1; i < world_size_; ++i) {
      const int source = ring_index(rank_ - i, world_size_);
      wait_signal(layout_.arrival_slot(source), layout_.block_signal(call_),
                  {kSerial, source, "its partial product"}, /*on_worker=*/false);
      accumulate(sum_.data(), config_.dtype, slot_rows(source, 0), count);
    }
    accumulate(sum_.data(), partial_.data() + row_elems(int64_t(rank_) * layout_.block_rows()),
               count);
    narrow(sum_.data(), config_.dtype, args.C.data(), count);
  }

  int64_t k_local_;  // K / W: columns of A_r, rows of B_r
  std::vector<PieceStep> steps_;
  std::vector<float> partial_;      // [M, N]: A_r . B_r
  std::vector<float> sum_;          // [M/W, N]: running sums of this rank's pieces
  std::vector<std::byte> staging_;  // [M/W, N] in dtype: what a put sends, rounded
  std::vector<float> a32_, b32_;    // bf16 only: widened A_r and B_r
};

}  // namespace

std::unique_ptr<OverlapBackend> make_cpu_gemm_reduce_scatter(Communicator& comm,
                                                             const OverlapConfig& config) {
  return std::make_unique<CpuGemmReduceScatter>(comm, config);
}

}  // namespace pmoe::detail
