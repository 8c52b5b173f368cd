// AllGatherGemm on a device: rank r multiplies the gathered A piece by piece on its compute
// stream (comm.stream(), cuBLAS) while its copy stream pulls the next pieces from the peers'
// symmetric memory with cudaMemcpyAsync (copy engines on a GPU: no SM is taken from the GEMMs;
// PMOE_OVERLAP_COPY=kernel copies with a kernel on a few blocks instead, overlap_stream.hpp).
//
//   symmetric region of rank r:  | block 0 | block 1 | ... | block W-1 |   (M x K, config.dtype)
//   signals of rank r:           landed[b * P + p] = e  (piece p of block b is here, call e)
//                                done = e               (r has pulled everything of call e)
//                                call = e               (this op's calls so far; r's own)
//
//   compute stream: call += 1 | fork
//   copy stream:    fork <- compute | wait every peer's done >= e-1 | A -> block r | landed(r,*)
//                   then for each step j = 1..W-1, block b = r + j, piece p:
//                   wait source's landed(b,p) >= e | pull piece | landed(b,p) = e | event(b,p)
//                   | done = e
//   compute stream: GEMM block r's pieces | wait event(b,p), GEMM piece ... | join <- copy
//
// The source of a pull: all-pairs, the block's owner b; ring, rank r+1 (which got block b one
// step earlier), so every rank reads only its right neighbour. Pulls rather than pushes: a rank
// writes only its own memory, and the only cross-rank hazard, a peer overwriting a block another
// still reads, is closed by the done words. Nothing here waits on the host and the call number
// e is read from device memory, so run() returns at once and can be captured in a CUDA graph;
// the caller sees C in stream order on comm.stream().
#include <memory>
#include <string>
#include <vector>

#include "backends/overlap_backend.hpp"
#include "core/device_runtime.hpp"
#include "cuda/check.hpp"
#include "cuda/flavor.hpp"
#include "cuda/gemm/cublas_gemm.hpp"
#include "cuda/overlap/overlap_stream.hpp"
#include "cuda/overlap/signals.cuh"
#include "overlap/plan.hpp"

namespace pmoe::detail::inline PMOE_CUDA_FLAVOR {
namespace {

using cuda::OverlapStreams;

class CudaAllGatherGemm final : public OverlapBackend {
 public:
  CudaAllGatherGemm(Communicator& comm, const OverlapConfig& config)
      : config_(config),
        rank_(comm.rank()),
        W_(comm.size()),
        layout_(config.m, comm.size(), config.chunks),
        elem_(dtype_size(config.dtype)),
        streams_(comm, config.chunks) {
    memory_ = comm.alloc_symmetric(size_t(config.m * config.k) * elem_, config.chunks + 2);
    comm.barrier();  // every rank's streams and memory exist before any peer's first wait
  }

  void run(const OverlapArgs& a) override {
    begin_call();
    const cudaStream_t copy = streams_.copy(), compute = streams_.compute();
    streams_.fork();
    gather(a, copy, /*record=*/true);
    const int P = layout_.pieces();
    for (int step = 0; step < W_; ++step) {
      const int b = (rank_ + step) % W_;
      for (int p = 0; p < P; ++p) {
        if (step > 0) PMOE_CUDA_CHECK(cudaStreamWaitEvent(compute, streams_.piece_event(b * P + p), 0));
        gemm_piece(a, b, p);
      }
    }
    streams_.join();
  }

  void run_serial(const OverlapArgs& a, SerialStep step) override {
    if (step != SerialStep::gemm) {
      begin_call();
      gather(a, streams_.compute(), /*record=*/false);
    }
    if (step != SerialStep::communicate) {
      const int64_t n_local = config_.n / W_;
      cuda::gemm_row_major(streams_.cublas(), config_.dtype, int(config_.m), int(n_local),
                           int(config_.k), memory_->local(), int(config_.k), a.B.data(),
                           int(n_local), a.C.data(), int(n_local));
    }
  }

  void run_gemm_only(const OverlapArgs& a) override {
    for (int b = 0; b < W_; ++b)
      for (int p = 0; p < layout_.pieces(); ++p) gemm_piece(a, b, p);
  }

  bool overlaps() const override { return W_ > 1; }
  size_t workspace_bytes() const override {
    return memory_->bytes() + size_t(memory_->signal_slots()) * SymmetricMemory::kSignalBytes +
           streams_.bytes();
  }

 private:
  // The call's number, counted on the compute stream: the copy stream reads it after the fork.
  void begin_call() {
    streams_.throw_if_faulted("AllGatherGemm", rank_);
    cuda::count_call(call_word(), streams_.compute());
  }
  uint64_t* call_word() const { return memory_->signal_word(rank_, config_.chunks + 1); }

  std::byte* block_at(std::byte* region, int b, int p) const {
    return region + size_t(layout_.row(b, p) * config_.k) * elem_;
  }
  size_t piece_bytes(int p) const { return size_t(layout_.piece_rows(p) * config_.k) * elem_; }
  int landed_slot(int b, int p) const { return b * layout_.pieces() + p; }
  int done_slot() const { return config_.chunks; }

  // The communication of one call on `stream`: own block in, then every other block, piece by
  // piece, each announced on this rank's landed word (and by its event, when `record`).
  void gather(const OverlapArgs& a, cudaStream_t stream, bool record) {
    const int P = layout_.pieces();
    const uint64_t* e = call_word();
    const uint64_t timeout = streams_.timeout_ns();
    // A peer may still be reading this rank's memory for call e - 1.
    for (int q = 0; q < W_; ++q)
      if (q != rank_)
        cuda::wait_for_signal(memory_->signal_word(q, done_slot()), e, 1, timeout, q,
                              cuda::kWaitDone, streams_.fault(), stream);
    streams_.copy_piece(block_at(memory_->local(), rank_, 0), a.A.data(), a.A.nbytes(), stream);
    for (int p = 0; p < P; ++p)
      cuda::raise_signal(memory_->signal_word(rank_, landed_slot(rank_, p)), e, stream);
    for (int step = 1; step < W_; ++step) {
      const int b = (rank_ + step) % W_;
      const int source = config_.order == OverlapOrder::ring ? (rank_ + 1) % W_ : b;
      for (int p = 0; p < P; ++p) {
        cuda::wait_for_signal(memory_->signal_word(source, landed_slot(b, p)), e, 0, timeout,
                              source, cuda::kWaitPiece, streams_.fault(), stream);
        streams_.copy_piece(block_at(memory_->local(), b, p),
                            block_at(memory_->peer(source), b, p), piece_bytes(p), stream);
        cuda::raise_signal(memory_->signal_word(rank_, landed_slot(b, p)), e, stream);
        if (record) PMOE_CUDA_CHECK(cudaEventRecord(streams_.piece_event(landed_slot(b, p)), stream));
      }
    }
    raise_done(stream);
  }

  void raise_done(cudaStream_t stream) {
    cuda::raise_signal(memory_->signal_word(rank_, done_slot()), call_word(), stream);
  }

  void gemm_piece(const OverlapArgs& a, int b, int p) {
    const int64_t n_local = config_.n / W_;
    const int64_t row = layout_.row(b, p);
    // The own block straight from A: its GEMMs need not wait for the copy into the buffer.
    const std::byte* a_rows =
        b == rank_ ? static_cast<const std::byte*>(a.A.data()) +
                         size_t(layout_.piece_begin(p) * config_.k) * elem_
                   : block_at(memory_->local(), b, p);
    cuda::gemm_row_major(streams_.cublas(), config_.dtype, int(layout_.piece_rows(p)),
                         int(n_local), int(config_.k), a_rows,
                         int(config_.k), a.B.data(), int(n_local),
                         static_cast<std::byte*>(a.C.data()) + size_t(row * n_local) * elem_,
                         int(n_local));
  }

  OverlapConfig config_;
  int rank_, W_;
  ChunkLayout layout_;
  size_t elem_;
  OverlapStreams streams_;
  std::unique_ptr<SymmetricMemory> memory_;
};

}  // namespace

std::unique_ptr<OverlapBackend> make_device_all_gather_gemm(Communicator& comm,
                                                            const OverlapConfig& config) {
  return std::make_unique<CudaAllGatherGemm>(comm, config);
}

}  // namespace pmoe::detail::inline PMOE_CUDA_FLAVOR
