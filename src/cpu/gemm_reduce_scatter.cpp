// GemmReduceScatter on the CPU backend.
//
// A block (M/W rows of the product) is cut into P = chunks / W pieces of columns, widths
// differing by at most one: the GEMM of piece p reads columns [c_p, c_p + w_p) of B only. Pieces
// of rows would make every BLAS call pack all of B again (OpenBLAS packs its B operand in every
// call; at chunks 8 that cost 9% of the GEMM here); pieces of columns pack B once per block.
//
// Symmetric memory on every rank: W receive slots of M/W x N elements in the op's dtype, each
// stored piece-major, so that a piece is one contiguous run of M/W x w_p elements (one put):
//   all-pairs: slot s holds rank s's partial product for this rank's block;
//   ring:      slot b holds the running sum for block b that rank r+1 forwards here.
//
//   recv      | slot 0: | piece 0 [M/W, w_0] | piece 1 [M/W, w_1] | ... | | slot 1 | ...
//   partial   [M, N] f32, private, row-major: A_r . B_r, written piece by piece
//   sum       [M/W x N] f32, private, piece-major: this call's running sums
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

// A [rows, cols] block of f32 values whose rows are `ld` elements apart.
struct F32Block {
  const float* data;
  int64_t ld;
};

class CpuGemmReduceScatter final : public CpuOverlapBase {
 public:
  CpuGemmReduceScatter(Communicator& comm, const OverlapConfig& config)
      : CpuOverlapBase(comm, config, size_t(config.m * config.n) * size_t(dtype_size(config.dtype)),
                       size_t((comm.size() - 1) * (config.m / comm.size()) * config.n) *
                           size_t(dtype_size(config.dtype))),
        k_local_(config.k / comm.size()),
        rows_(layout_.block_rows()),
        columns_{config.n, layout_.pieces()},
        steps_(reduce_scatter_steps(rank_, layout_)),
        partial_(size_t(config.m * config.n)),
        sum_(size_t(rows_ * config.n)),
        staging_(size_t(rows_ * config.n) * dsize_) {
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

  // Elements before piece p inside a piece-major [M/W x N] area (a receive slot, `sum_`).
  int64_t piece_offset(int p) const { return rows_ * columns_.begin(p); }
  size_t slot_offset(int slot, int p) const {
    return size_t(int64_t(slot) * rows_ * config_.n + piece_offset(p)) * dsize_;
  }
  const std::byte* slot_piece(int slot, int p) const {
    return memory_->local() + slot_offset(slot, p);
  }
  float* sum_piece(int p) { return sum_.data() + piece_offset(p); }
  // This rank's partial product for piece p of `block`, inside the row-major [M, N] partial.
  F32Block partial_piece(int block, int p) const {
    return {partial_.data() + int64_t(block) * rows_ * config_.n + columns_.begin(p), config_.n};
  }

  // Columns of piece s of its block in `partial` = (the block's rows of A) . (B's columns).
  void multiply(const OverlapArgs& args, const PieceStep& s) {
    const int64_t N = config_.n, Kl = k_local_, row = int64_t(s.block) * rows_;
    const int64_t col = columns_.begin(s.piece), width = columns_.size(s.piece);
    const float* a;
    const float* b;
    if (config_.dtype == DType::f32) {
      a = args.A.data<float>() + row * Kl;
      b = args.B.data<float>();
    } else {
      a = a32_.data() + row * Kl;
      b = b32_.data();
      if (s.piece == 0)  // the block's rows of A, once for its pieces
        widen(config_.dtype,
              static_cast<const std::byte*>(args.A.data()) + size_t(row * Kl) * dsize_,
              a32_.data() + row * Kl, rows_ * Kl);
    }
    cpu::gemm_f32(int(rows_), int(width), int(Kl), a, int(Kl), b + col, int(N),
                  partial_.data() + row * N + col, int(N));
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
    const int64_t count = rows_ * columns_.size(s.piece);
    const uint64_t arrived = layout_.piece_signal(call_, s.piece);
    float* sum = sum_piece(s.piece);
    if (config_.order == OverlapOrder::ring) {
      if (s.step == 0) return;  // the chain of block b starts here
      const int next = ring_index(rank_ + 1, world_size_);
      wait_signal(layout_.arrival_slot(s.block), arrived, {kRun, next, "a running sum to add to"},
                  on_worker);
      widen(config_.dtype, slot_piece(s.block, s.piece), sum, count);  // ranks b-1 .. r+1
      return;
    }
    if (s.block != rank_) return;
    std::fill(sum, sum + count, 0.0f);
    for (int i = 1; i < world_size_; ++i) {  // sources b-1, b-2, ..., b+1
      const int source = ring_index(rank_ - i, world_size_);
      wait_signal(layout_.arrival_slot(source), arrived, {kRun, source, "its partial product"},
                  on_worker);
      accumulate(sum, config_.dtype, slot_piece(source, s.piece), count);
    }
  }

  void finish_piece(const OverlapArgs& args, const PieceStep& s, bool on_worker) {
    const int64_t width = columns_.size(s.piece);
    const F32Block mine = partial_piece(s.block, s.piece);
    const bool ring = config_.order == OverlapOrder::ring;
    const bool has_arrivals = ring ? s.step > 0 : s.block == rank_;
    F32Block total = mine;
    if (has_arrivals) {
      float* sum = sum_piece(s.piece);
      for (int64_t r = 0; r < rows_; ++r)
        accumulate(sum + r * width, mine.data + r * mine.ld, width);
      total = {sum, width};
    }
    if (s.block == rank_) {
      auto* c = static_cast<std::byte*>(args.C.data());
      for (int64_t r = 0; r < rows_; ++r)
        narrow(total.data + r * total.ld, config_.dtype,
               c + size_t(r * config_.n + columns_.begin(s.piece)) * dsize_, width);
      return;
    }
    const int dest = ring ? ring_index(rank_ - 1, world_size_) : s.block;
    const int slot = ring ? s.block : rank_;
    wait_ready(dest, kRun, on_worker);
    put_rounded(dest, slot_offset(slot, s.piece), total, width);
    memory_->signal(dest, layout_.arrival_slot(slot), layout_.piece_signal(call_, s.piece));
  }

  // Writes the [M/W, width] values of `values`, rounded to the op's dtype and contiguous, into
  // rank `dest`'s memory at `offset`: straight into it where it is load/store reachable, else
  // through staging and one put.
  void put_rounded(int dest, size_t offset, const F32Block& values, int64_t width) {
    std::byte* peer = memory_->peer(dest);
    std::byte* out = peer ? peer + offset : staging_.data();
    for (int64_t r = 0; r < rows_; ++r)
      narrow(values.data + r * values.ld, config_.dtype, out + size_t(r * width) * dsize_, width);
    if (!peer) memory_->put(dest, offset, staging_.data(), size_t(rows_ * width) * dsize_);
  }

  // The baseline's GEMM: all M rows and N columns at once.
  void multiply_all(const OverlapArgs& args) {
    prepare_b(args);
    const int64_t M = config_.m, N = config_.n, Kl = k_local_;
    const float* a = args.A.data<float>();
    const float* b = args.B.data<float>();
    if (config_.dtype != DType::f32) {
      widen(config_.dtype, args.A.data(), a32_.data(), M * Kl);
      a = a32_.data();
      b = b32_.data();
    }
    cpu::gemm_f32(int(M), int(N), int(Kl), a, int(Kl), b, int(N), partial_.data(), int(N));
  }

  // The baseline's collective: each block of the partial product to its owner directly, then
  // the sum of the arrivals and the own block, in the same order as run().
  void reduce_scatter(const OverlapArgs& args) {
    begin_call();
    const int P = layout_.pieces();
    for (int s = 0; s + 1 < world_size_; ++s) {
      const int dest = ring_index(rank_ + 1 + s, world_size_);
      wait_ready(dest, kSerial, /*on_worker=*/false);
      for (int p = 0; p < P; ++p)
        put_rounded(dest, slot_offset(rank_, p), partial_piece(dest, p), columns_.size(p));
      memory_->signal(dest, layout_.arrival_slot(rank_), layout_.block_signal(call_));
    }
    std::fill(sum_.begin(), sum_.end(), 0.0f);
    for (int i = 1; i < world_size_; ++i) {
      const int source = ring_index(rank_ - i, world_size_);
      wait_signal(layout_.arrival_slot(source), layout_.block_signal(call_),
                  {kSerial, source, "its partial product"}, /*on_worker=*/false);
      accumulate(sum_.data(), config_.dtype, slot_piece(source, 0), rows_ * config_.n);
    }
    auto* c = static_cast<std::byte*>(args.C.data());
    for (int p = 0; p < P; ++p) {
      const int64_t width = columns_.size(p), col = columns_.begin(p);
      const F32Block mine = partial_piece(rank_, p);
      float* sum = sum_piece(p);
      for (int64_t r = 0; r < rows_; ++r) {
        accumulate(sum + r * width, mine.data + r * mine.ld, width);
        narrow(sum + r * width, config_.dtype, c + size_t(r * config_.n + col) * dsize_, width);
      }
    }
  }

  int64_t k_local_;    // K / W: columns of A_r, rows of B_r
  int64_t rows_;       // M / W: rows of a block
  EvenSplit columns_;  // N cut into the pieces of a block
  std::vector<PieceStep> steps_;
  std::vector<float> partial_;      // [M, N] row-major: A_r . B_r
  std::vector<float> sum_;          // [M/W x N] piece-major: running sums of this rank's pieces
  std::vector<std::byte> staging_;  // [M/W x N] in dtype: a piece rounded for an MPI put
  std::vector<float> a32_, b32_;    // 16-bit dtypes only: widened A_r, B_r
};

}  // namespace

std::unique_ptr<OverlapBackend> make_cpu_gemm_reduce_scatter(Communicator& comm,
                                                             const OverlapConfig& config) {
  return std::make_unique<CpuGemmReduceScatter>(comm, config);
}

}  // namespace pmoe::detail
