// AllGatherGemm on the CPU backend.
//
// Symmetric memory on every rank: the gathered A, [M, K] in the op's dtype, block b (rows
// [b M/W, (b+1) M/W)) written by whoever sends block b to this rank. This rank's own block is
// written here only by run_serial(); run() multiplies it straight from the caller's A.
//
//   gathered  | block 0 | block 1 | ... | block W-1 |     C_r = gathered . B_r, piece by piece
//
// run(): the worker puts pieces (overlap/plan.hpp: all_gather_sends) and signals each; this
// thread multiplies its own block (one GEMM), then the other pieces in all_gather_steps order,
// waiting for each one's signal. Private f32 staging exists for 16-bit dtypes only: widened A
// rows, the widened B, and C before rounding.
#include <cstring>
#include <vector>

#include "cpu/gemm.hpp"
#include "cpu/overlap_base.hpp"
#include "cpu/overlap_rows.hpp"

namespace pmoe::detail {
namespace {

class CpuAllGatherGemm final : public CpuOverlapBase {
 public:
  CpuAllGatherGemm(Communicator& comm, const OverlapConfig& config)
      : CpuOverlapBase(comm, config, size_t(config.m * config.k) * size_t(dtype_size(config.dtype)),
                       size_t((comm.size() - 1) * (config.m / comm.size()) * config.k) *
                           size_t(dtype_size(config.dtype))),
        n_local_(config.n / comm.size()),
        steps_(all_gather_steps(rank_, layout_)),
        sends_(all_gather_sends(rank_, layout_, config.order == OverlapOrder::ring)) {
    if (config_.dtype != DType::f32) {
      a32_.resize(size_t(config_.m * config_.k));
      b32_.resize(size_t(config_.k * n_local_));
      c32_.resize(size_t(config_.m * n_local_));
    }
  }

  size_t workspace_bytes() const override {
    return base_workspace_bytes() + (a32_.size() + b32_.size() + c32_.size()) * sizeof(float);
  }

  void run(const OverlapArgs& args) override {
    begin_call();
    const size_t P = size_t(layout_.pieces());
    if (worker_) {
      pipeline(
          [&] {
            for (const GatherSend& s : sends_) send(args, s, /*on_worker=*/true);
          },
          [&] {
            prepare_b(args);  // here, so that the first piece leaves at once
            multiply_own_block(args);
            for (size_t i = P; i < steps_.size(); ++i) receive_and_multiply(args, steps_[i]);
          });
      return;
    }
    prepare_b(args);
    multiply_own_block(args);
    // No worker: step i's send comes just before step i's wait, so a ring relay always forwards
    // a piece that an earlier step received.
    for (size_t i = P; i < steps_.size(); ++i) {
      send(args, sends_[i - P], /*on_worker=*/false);
      receive_and_multiply(args, steps_[i]);
    }
  }

  void run_serial(const OverlapArgs& args, SerialStep step) override {
    if (step != SerialStep::gemm) all_gather(args);
    if (step != SerialStep::communicate) multiply_gathered(args);
  }

  void run_gemm_only(const OverlapArgs& args) override {
    prepare_b(args);
    multiply_own_block(args);
    for (size_t i = size_t(layout_.pieces()); i < steps_.size(); ++i)
      multiply(args, steps_[i].block, layout_.piece_begin(steps_[i].piece),
               layout_.piece_rows(steps_[i].piece));
  }

 private:
  static constexpr const char* kRun = "AllGatherGemm::run";
  static constexpr const char* kSerial = "AllGatherGemm::run_serial(communicate)";

  // The rows of `block` as this rank holds them: its own A, or the gathered buffer.
  const std::byte* rows_of(const OverlapArgs& args, int block, int64_t row_in_block) const {
    const int64_t row =
        block == rank_ ? row_in_block : int64_t(block) * layout_.block_rows() + row_in_block;
    const auto* base =
        block == rank_ ? static_cast<const std::byte*>(args.A.data()) : memory_->local();
    return base + size_t(row * config_.k) * dsize_;
  }

  void send(const OverlapArgs& args, const GatherSend& s, bool on_worker) {
    wait_ready(s.dest, kRun, on_worker);
    if (s.relayed)
      wait_signal(layout_.arrival_slot(s.block), layout_.piece_signal(call_, s.piece),
                  {kRun, ring_index(rank_ + 1, world_size_), "a piece to forward"}, on_worker);
    const int64_t rows = layout_.piece_rows(s.piece), row = layout_.row(s.block, s.piece);
    memory_->put(s.dest, size_t(row * config_.k) * dsize_,
                 rows_of(args, s.block, layout_.piece_begin(s.piece)),
                 size_t(rows * config_.k) * dsize_);
    memory_->signal(s.dest, layout_.arrival_slot(s.block), layout_.piece_signal(call_, s.piece));
  }

  void receive_and_multiply(const OverlapArgs& args, const PieceStep& s) {
    if (s.block != rank_) {
      const int from =
          config_.order == OverlapOrder::ring ? ring_index(rank_ + 1, world_size_) : s.block;
      wait_signal(layout_.arrival_slot(s.block), layout_.piece_signal(call_, s.piece),
                  {kRun, from, "a piece of A"}, /*on_worker=*/false);
    }
    multiply(args, s.block, layout_.piece_begin(s.piece), layout_.piece_rows(s.piece));
  }

  // The own block's pieces (steps 0 .. P-1) in one GEMM: they are all here from the start, and
  // a BLAS call costs a packing of all of B whatever its rows, so pieces that need not wait for
  // a transfer are not worth splitting. Timing never changes the split, so neither do results.
  void multiply_own_block(const OverlapArgs& args) {
    multiply(args, rank_, 0, layout_.block_rows());
  }

  // C rows of `rows` rows of `block` from `row_in_block` = (those rows of A) . B.
  void multiply(const OverlapArgs& args, int block, int64_t row_in_block, int64_t rows) {
    const int64_t row = int64_t(block) * layout_.block_rows() + row_in_block;
    const int64_t K = config_.k;
    const std::byte* a = rows_of(args, block, row_in_block);
    if (config_.dtype == DType::f32) {
      cpu::gemm_f32(int(rows), int(n_local_), int(K), reinterpret_cast<const float*>(a), int(K),
                    args.B.data<float>(), int(n_local_), args.C.data<float>() + row * n_local_,
                    int(n_local_));
      return;
    }
    float* a32 = a32_.data() + row * K;
    float* c32 = c32_.data() + row * n_local_;
    widen(config_.dtype, a, a32, rows * K);
    cpu::gemm_f32(int(rows), int(n_local_), int(K), a32, int(K), b32_.data(), int(n_local_), c32,
                  int(n_local_));
    narrow(c32, config_.dtype,
           static_cast<std::byte*>(args.C.data()) + size_t(row * n_local_) * dsize_,
           rows * n_local_);
  }

  void prepare_b(const OverlapArgs& args) {
    if (config_.dtype != DType::f32)
      widen(config_.dtype, args.B.data(), b32_.data(), config_.k * n_local_);
  }

  // The baseline's collective: this rank's block to every peer directly, then wait for all.
  void all_gather(const OverlapArgs& args) {
    begin_call();
    const size_t block_bytes = size_t(layout_.block_rows() * config_.k) * dsize_;
    const size_t own_offset = size_t(rank_) * block_bytes;
    std::memcpy(memory_->local() + own_offset, args.A.data(), block_bytes);
    for (int s = 1; s < world_size_; ++s) {
      const int dest = ring_index(rank_ - s, world_size_);
      wait_ready(dest, kSerial, /*on_worker=*/false);
      memory_->put(dest, own_offset, args.A.data(), block_bytes);
      memory_->signal(dest, layout_.arrival_slot(rank_), layout_.block_signal(call_));
    }
    for (int s = 1; s < world_size_; ++s) {
      const int source = ring_index(rank_ + s, world_size_);
      wait_signal(layout_.arrival_slot(source), layout_.block_signal(call_),
                  {kSerial, source, "its block of A"}, /*on_worker=*/false);
    }
  }

  // The baseline's GEMM: all M gathered rows at once.
  void multiply_gathered(const OverlapArgs& args) {
    const int64_t M = config_.m, K = config_.k;
    const auto* gathered = memory_->local();
    if (config_.dtype == DType::f32) {
      cpu::gemm_f32(int(M), int(n_local_), int(K), reinterpret_cast<const float*>(gathered), int(K),
                    args.B.data<float>(), int(n_local_), args.C.data<float>(), int(n_local_));
      return;
    }
    prepare_b(args);
    widen(config_.dtype, gathered, a32_.data(), M * K);
    cpu::gemm_f32(int(M), int(n_local_), int(K), a32_.data(), int(K), b32_.data(), int(n_local_),
                  c32_.data(), int(n_local_));
    narrow(c32_.data(), config_.dtype, args.C.data(), M * n_local_);
  }

  int64_t n_local_;  // N / W: columns of B_r and C_r
  std::vector<PieceStep> steps_;
  std::vector<GatherSend> sends_;
  std::vector<float> a32_, b32_, c32_;  // 16-bit dtypes only: f32 staging
};

}  // namespace

std::unique_ptr<OverlapBackend> make_cpu_all_gather_gemm(Communicator& comm,
                                                         const OverlapConfig& config) {
  return std::make_unique<CpuAllGatherGemm>(comm, config);
}

}  // namespace pmoe::detail
