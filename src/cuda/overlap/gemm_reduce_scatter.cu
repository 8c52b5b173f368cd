// GemmReduceScatter on a device: rank r multiplies its partial products piece by piece on its
// compute stream (comm.stream(), cuBLAS, f32 out) while its copy stream rounds the finished
// pieces for their peers, pulls the peers' pieces from their symmetric memory with
// cudaMemcpyAsync (copy engines on a GPU; or a copy kernel, PMOE_OVERLAP_COPY=kernel) and sums
// them (piece_sum.cu).
//
// Pieces are of columns, as on the CPU (docs/design.md): block b (rows [b M/W, (b+1) M/W) of the
// product) is cut into P = chunks / W pieces of N, piece p [M/W, w_p] stored contiguous.
//
//   symmetric region of rank r, in the dtype:
//     send | slot 0 | slot 1 | ... | slot W-1 |   slot b: what r gives for block b, piece-major
//     recv | slot 0 | slot 1 | ... | slot W-1 |   all-pairs: slot s from rank s; ring: slot b
//   partial (private, f32): run(): block b piece p at b M/W N + M/W c_p, [M/W, w_p];
//                           run_serial(): [M, N] row-major
//   signals of rank r: ready[b * P + p] = e (send piece (b, p) of call e is there), done = e (r
//                      has pulled everything of call e), call = e (r's own count)
//
//   compute stream: call += 1 | fork | GEMM (s, p) -> partial, event(s, p) ... | join <- copy
//   copy stream:    wait every peer's done >= e-1 (they no longer read r's send slots), then
//                   for step s = 0..W-1 (block b = r+1+s), piece p:
//     ring:       [s > 0: wait (r+1).ready(b, p) >= e, pull its send (b, p) -> recv (b, p)]
//                 wait event(s, p) | sum recv (b, p) (s > 0) + partial -> send (b, p) or C
//                 | b != r: ready(b, p) = e
//     all-pairs:  wait event(s, p) | b != r: partial -> send (b, p), ready(b, p) = e;
//                 then pull from q = r-1-s (who makes block r's piece p at this step):
//                 wait q.ready(r, p) >= e, q's send (r, p) -> recv (q, p)
//                 b == r (last step): sum recv (r-1, p), ..., recv (r+1, p) + partial -> C
//                   | done = e
//
// Every rank raises its piece of a step before it waits for a peer's piece of the same step, so
// the waits form no cycle. The f32 sums of block b run over ranks b-1, b-2, ..., b+1, then b,
// in both orders, as on the CPU; every value that travels is rounded once to the dtype.
#include <memory>

#include "backends/overlap_backend.hpp"
#include "core/device_runtime.hpp"
#include "cuda/check.hpp"
#include "cuda/flavor.hpp"
#include "cuda/gemm/cublas_gemm.hpp"
#include "cuda/overlap/overlap_stream.hpp"
#include "cuda/overlap/piece_sum.cuh"
#include "cuda/overlap/signals.cuh"
#include "overlap/plan.hpp"

namespace pmoe::detail::inline PMOE_CUDA_FLAVOR {
namespace {

using cuda::OverlapStreams;

class CudaGemmReduceScatter final : public OverlapBackend {
 public:
  CudaGemmReduceScatter(Communicator& comm, const OverlapConfig& config)
      : config_(config),
        rank_(comm.rank()),
        W_(comm.size()),
        layout_(config.m, comm.size(), config.chunks),
        rows_(config.m / comm.size()),
        k_local_(config.k / comm.size()),
        columns_{config.n, config.chunks / comm.size()},
        elem_(dtype_size(config.dtype)),
        streams_(comm, config.chunks) {
    memory_ = comm.alloc_symmetric(2 * size_t(config.m * config.n) * elem_, config.chunks + 2);
    PMOE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&partial_),
                               size_t(config.m * config.n) * sizeof(float)));
    comm.barrier();  // every rank's streams and memory exist before any peer's first wait
  }
  ~CudaGemmReduceScatter() override {
    (void)cudaStreamSynchronize(streams_.compute());
    (void)cudaFree(partial_);
  }

  void run(const OverlapArgs& a) override {
    begin_call();
    const cudaStream_t copy = streams_.copy(), compute = streams_.compute();
    streams_.fork();
    const int P = layout_.pieces();
    for (int s = 0; s < W_; ++s)
      for (int p = 0; p < P; ++p) {
        gemm_piece(a, block_at_step(s), p);
        PMOE_CUDA_CHECK(cudaEventRecord(streams_.piece_event(s * P + p), compute));
      }
    wait_until_peers_are_done(copy);
    for (int s = 0; s < W_; ++s) {
      const int b = block_at_step(s);
      for (int p = 0; p < P; ++p) {
        if (ring() && s > 0) pull(ring_index(rank_ + 1, W_), b, p, /*into_slot=*/b, copy);
        PMOE_CUDA_CHECK(cudaStreamWaitEvent(copy, streams_.piece_event(s * P + p), 0));
        finish_piece(a, b, p, /*arrivals=*/ring() ? (s > 0 ? 1 : 0) : (b == rank_ ? W_ - 1 : 0),
                     copy);
        if (b != rank_) raise(ready_slot(b, p), copy);
        if (!ring() && b != rank_) {
          const int q = ring_index(rank_ - 1 - s, W_);
          pull(q, rank_, p, /*into_slot=*/q, copy);
        }
      }
    }
    raise(done_slot(), copy);
    streams_.join();
  }

  void run_serial(const OverlapArgs& a, SerialStep step) override {
    if (step != SerialStep::communicate) {
      cuda::gemm_row_major_f32_out(streams_.cublas(), config_.dtype, int(config_.m),
                                   int(config_.n), int(k_local_), a.A.data(), int(k_local_),
                                   a.B.data(), int(config_.n), partial_, int(config_.n));
    }
    if (step != SerialStep::gemm) reduce_scatter(a);
  }

  void run_gemm_only(const OverlapArgs& a) override {
    for (int s = 0; s < W_; ++s)
      for (int p = 0; p < layout_.pieces(); ++p) gemm_piece(a, block_at_step(s), p);
  }

  bool overlaps() const override { return W_ > 1; }
  size_t workspace_bytes() const override {
    return memory_->bytes() + size_t(memory_->signal_slots()) * SymmetricMemory::kSignalBytes +
           size_t(config_.m * config_.n) * sizeof(float) + streams_.bytes();
  }

 private:
  bool ring() const { return config_.order == OverlapOrder::ring; }
  int block_at_step(int s) const { return ring_index(rank_ + 1 + s, W_); }
  int ready_slot(int b, int p) const { return b * layout_.pieces() + p; }
  int done_slot() const { return config_.chunks; }
  uint64_t* call_word() const { return memory_->signal_word(rank_, config_.chunks + 1); }

  // The call's number, counted on the compute stream: the copy stream reads it after the fork.
  void begin_call() {
    streams_.throw_if_faulted("GemmReduceScatter", rank_);
    cuda::count_call(call_word(), streams_.compute());
  }

  // Elements from a slot's start to its piece p; bytes from a region's start to slot `slot`'s
  // piece p of the send (recv = false) or receive area.
  int64_t piece_offset(int p) const { return rows_ * columns_.begin(p); }
  size_t slot_bytes(bool recv, int slot, int p) const {
    return size_t((recv ? config_.m * config_.n : 0) + int64_t(slot) * rows_ * config_.n +
                  piece_offset(p)) *
           elem_;
  }
  std::byte* area(std::byte* region, bool recv, int slot, int p) const {
    return region + slot_bytes(recv, slot, p);
  }
  float* partial_piece(int b, int p) const {
    return partial_ + int64_t(b) * rows_ * config_.n + piece_offset(p);
  }

  void gemm_piece(const OverlapArgs& a, int b, int p) {
    const int64_t width = columns_.size(p);
    cuda::gemm_row_major_f32_out(
        streams_.cublas(), config_.dtype, int(rows_), int(width), int(k_local_),
        static_cast<const std::byte*>(a.A.data()) + size_t(b * rows_ * k_local_) * elem_,
        int(k_local_),
        static_cast<const std::byte*>(a.B.data()) + size_t(columns_.begin(p)) * elem_,
        int(config_.n), partial_piece(b, p), int(width));
  }

  // The pieces a peer may overwrite only once this rank has pulled them: wait for every
  // peer's done word of the previous call before this call writes its send slots.
  void wait_until_peers_are_done(cudaStream_t stream) {
    for (int q = 0; q < W_; ++q)
      if (q != rank_)
        cuda::wait_for_signal(memory_->signal_word(q, done_slot()), call_word(), 1,
                              streams_.timeout_ns(), q, cuda::kWaitDone, streams_.fault(), stream);
  }

  void raise(int slot, cudaStream_t stream) {
    cuda::raise_signal(memory_->signal_word(rank_, slot), call_word(), stream);
  }

  // Piece p of `source`'s send slot `block` into this rank's receive slot `into_slot`, once
  // the source has announced it for this call.
  void pull(int source, int block, int p, int into_slot, cudaStream_t stream) {
    cuda::wait_for_signal(memory_->signal_word(source, ready_slot(block, p)), call_word(), 0,
                          streams_.timeout_ns(), source, cuda::kWaitPiece, streams_.fault(),
                          stream);
    streams_.copy_piece(area(memory_->local(), true, into_slot, p),
                        area(memory_->peer(source), false, block, p),
                        size_t(rows_ * columns_.size(p)) * elem_, stream);
  }

  // Piece p of block b: `arrivals` received pieces plus this rank's partial, rounded into the
  // send slot (for a peer) or C (own block). Ring: the one arrival sits in receive slot b;
  // all-pairs: receive slots r-1, r-2, ..., r+1.
  void finish_piece(const OverlapArgs& a, int b, int p, int arrivals, cudaStream_t stream) {
    cuda::PieceSum sum;
    sum.rows = rows_;
    sum.width = columns_.size(p);
    sum.inputs = area(memory_->local(), true, 0, p);
    sum.input_stride = rows_ * config_.n;
    sum.first = ring() ? b : ring_index(rank_ - 1, W_);
    sum.count = arrivals;
    sum.world = W_;
    sum.mine = partial_piece(b, p);
    sum.mine_ld = sum.width;
    if (b == rank_) {
      sum.out = static_cast<std::byte*>(a.C.data()) + size_t(columns_.begin(p)) * elem_;
      sum.out_ld = config_.n;
    } else {
      sum.out = area(memory_->local(), false, b, p);
      sum.out_ld = sum.width;
    }
    cuda::launch_piece_sum(sum, config_.dtype, streams_.blocks(), stream);
  }

  // The baseline's collective, on the compute stream after the GEMM of [M, N] into partial:
  // every block but r's rounded into its send slot (row-major, the slot's piece 0 ready word),
  // every peer's block r pulled whole, then the sum in the same order as run().
  void reduce_scatter(const OverlapArgs& a) {
    begin_call();
    const cudaStream_t stream = streams_.compute();
    wait_until_peers_are_done(stream);
    cuda::PieceSum sum;
    sum.rows = rows_;
    sum.width = config_.n;
    sum.mine_ld = config_.n;
    sum.world = W_;
    for (int s = 0; s + 1 < W_; ++s) {
      const int b = block_at_step(s);
      sum.mine = partial_ + int64_t(b) * rows_ * config_.n;
      sum.out = area(memory_->local(), false, b, 0);
      sum.out_ld = config_.n;
      cuda::launch_piece_sum(sum, config_.dtype, streams_.blocks(), stream);
      raise(ready_slot(b, 0), stream);
    }
    for (int i = 1; i < W_; ++i) {
      const int q = ring_index(rank_ - i, W_);
      cuda::wait_for_signal(memory_->signal_word(q, ready_slot(rank_, 0)), call_word(), 0,
                            streams_.timeout_ns(), q, cuda::kWaitPiece, streams_.fault(), stream);
      streams_.copy_piece(area(memory_->local(), true, q, 0),
                          area(memory_->peer(q), false, rank_, 0),
                          size_t(rows_ * config_.n) * elem_, stream);
    }
    sum.inputs = area(memory_->local(), true, 0, 0);
    sum.input_stride = rows_ * config_.n;
    sum.first = ring_index(rank_ - 1, W_);
    sum.count = W_ - 1;
    sum.mine = partial_ + int64_t(rank_) * rows_ * config_.n;
    sum.out = a.C.data();
    sum.out_ld = config_.n;
    cuda::launch_piece_sum(sum, config_.dtype, streams_.blocks(), stream);
    raise(done_slot(), stream);
  }

  OverlapConfig config_;
  int rank_, W_;
  ChunkLayout layout_;
  int64_t rows_, k_local_;
  EvenSplit columns_;
  size_t elem_;
  OverlapStreams streams_;
  std::unique_ptr<SymmetricMemory> memory_;
  float* partial_ = nullptr;
};

}  // namespace

std::unique_ptr<OverlapBackend> make_device_gemm_reduce_scatter(Communicator& comm,
                                                                const OverlapConfig& config) {
  return std::make_unique<CudaGemmReduceScatter>(comm, config);
}

}  // namespace pmoe::detail::inline PMOE_CUDA_FLAVOR
