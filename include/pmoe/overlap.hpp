// Tensor-parallel GEMMs with their communication hidden behind the multiplication.
//
//   AllGatherGemm:     rank r holds A_r [M/W, K] and B_r [K, N/W];
//                      C_r [M, N/W] = all_gather_rows(A_0 .. A_{W-1}) . B_r
//   GemmReduceScatter: rank r holds A_r [M, K/W] and B_r [K/W, N];
//                      C_r [M/W, N] = rows [r M/W, (r + 1) M/W) of sum over s of A_s . B_s
//
// M, N and K are the global sizes (the seed's profiling harness takes them on its command line);
// W is the world size. The M rows are cut into W blocks of M/W rows (block b belongs to rank b),
// and each block into chunks / W pieces, sizes differing by at most one: pieces of rows for
// AllGatherGemm (what travels is rows of A), pieces of columns for GemmReduceScatter (so that
// the GEMM of a piece reads only its slice of B; BLAS packs its B operand anew in every call).
// run() multiplies piece after piece while the communication of the next piece is under way: on
// the CPU backend a communication thread of the rank moves piece i+1 while BLAS multiplies piece
// i; on a CUDA device (device = Device::cuda(i), the communicator's) cuBLAS multiplies on
// comm.stream() while a copy stream pulls the next pieces, and run() returns once the work is
// enqueued (C is ready in stream order on comm.stream(); run() can be captured in a CUDA graph).
// run_serial() is the baseline: the whole collective, then one GEMM (or the other way round).
//
// Every call is collective: every rank makes the same call (run, or run_serial with the same
// step) with the same config. Arguments are validated before a byte leaves the rank; a rejected
// call throws pmoe::Error and leaves the op usable. A wait that fails (a peer that never arrives
// within PMOE_TIMEOUT_S, another rank's failure) retires the op: later calls throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "pmoe/comm.hpp"
#include "pmoe/dtype.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe {

// Who sends a piece to whom. Either way rank r receives, and multiplies, the blocks in the order
// r, r+1, r+2, ... (mod W), pieces in order, so a piece is used in the order it arrives.
enum class OverlapOrder : uint8_t {
  all_pairs,  // direct: the rank that holds a piece puts it into its destination's memory
  ring,       // relay: a rank writes only to rank r-1, forwarding what came from rank r+1
};

struct OverlapConfig {
  int64_t m = 0;  // global M: rows of the gathered A (AllGatherGemm) or of the product (both)
  int64_t n = 0;  // global N: columns of B and of the product
  int64_t k = 0;  // global K: the contracted dimension
  DType dtype = DType::bf16;  // A, B and C: f32, bf16 or f16 (16-bit: multiplied in f32)
  int chunks = 0;  // pieces in the pipeline, a multiple of W (0 means W); AllGatherGemm: at
                   // most M (pieces of rows); GemmReduceScatter: chunks / W at most N (columns)
  OverlapOrder order = OverlapOrder::all_pairs;
  // A call that moves fewer bytes per rank than this does not overlap: its transfers run between
  // its GEMMs on the calling thread, because handing them to the CPU communication thread (a
  // wake-up and a hand-back per call) costs more than the transfer it would hide. 0: always.
  int64_t min_overlap_bytes = int64_t(1) << 20;

  // Throws pmoe::Error saying what to change if `op` ("AllGatherGemm" or "GemmReduceScatter")
  // cannot run with this config on `world_size` ranks.
  void validate(const char* op, int world_size) const;
  // `chunks` with the default resolved: W when 0.
  int chunks_for(int world_size) const { return chunks == 0 ? world_size : chunks; }
};

const char* order_name(OverlapOrder order);  // "all-pairs", "ring"
OverlapOrder parse_order(const char* name);  // the inverse; throws pmoe::Error

// The parts of run_serial(), so that a benchmark can time the collective and the GEMM apart.
enum class SerialStep : uint8_t {
  both,         // the collective and the GEMM in the op's order
  communicate,  // the collective alone (collective: every rank calls it)
  gemm,         // the GEMM alone, local: AllGatherGemm multiplies what the last communicate
                // gathered; GemmReduceScatter computes the partial product that the next
                // communicate reduce-scatters
};

namespace detail {
class OverlapOp;
}

class AllGatherGemm {
 public:
  // Collective over `comm`: checks that every rank passed the same config, then allocates the
  // symmetric buffer (the gathered A, M x K elements) and the signals, sized once. `comm` must
  // outlive the op. Throws pmoe::Error if the config cannot run on comm.size() ranks.
  AllGatherGemm(Communicator& comm, const OverlapConfig& config, Device device = Device::cpu());
  ~AllGatherGemm();
  AllGatherGemm(const AllGatherGemm&) = delete;
  AllGatherGemm& operator=(const AllGatherGemm&) = delete;

  // A [M/W, K], B [K, N/W], C [M, N/W] out; all config.dtype, row-major contiguous. A and B may
  // be overwritten once the call returns. Collective.
  void run(const Tensor& A, const Tensor& B, const Tensor& C);
  // The baseline: all-gather A, then one GEMM (or one of the two, see SerialStep).
  void run_serial(const Tensor& A, const Tensor& B, const Tensor& C,
                  SerialStep step = SerialStep::both);
  // run()'s piece-by-piece GEMMs with no communication and no waiting, on whatever the gathered
  // buffer holds (after a run() with the same A: the same C). Local; for benchmarks: it is what
  // run() would cost if communication were free.
  void run_gemm_only(const Tensor& A, const Tensor& B, const Tensor& C);

  // True when run() moves data on a communication thread: every peer is load/store reachable
  // and a call moves at least config.min_overlap_bytes. False when some peer is off-node (MPI
  // calls must stay on the rank's own thread) or the call is too small to gain: then run()
  // moves the pieces itself, between its GEMMs, in the same order. On a CUDA device: W > 1 (the
  // copy stream).
  bool overlaps() const;
  // Bytes this op allocated per rank: symmetric buffer, signals, f32 staging for 16-bit dtypes
  // (CPU), f32 partial products (GemmReduceScatter on a device).
  size_t workspace_bytes() const;
  const OverlapConfig& config() const;

 private:
  std::unique_ptr<detail::OverlapOp> op_;
};

class GemmReduceScatter {
 public:
  // Collective over `comm`: checks that every rank passed the same config, then allocates the
  // symmetric receive buffer (W slots of M/W x N elements) and the signals, sized once. `comm`
  // must outlive the op. Throws pmoe::Error if the config cannot run on comm.size() ranks.
  GemmReduceScatter(Communicator& comm, const OverlapConfig& config, Device device = Device::cpu());
  ~GemmReduceScatter();
  GemmReduceScatter(const GemmReduceScatter&) = delete;
  GemmReduceScatter& operator=(const GemmReduceScatter&) = delete;

  // A [M, K/W], B [K/W, N], C [M/W, N] out; all config.dtype, row-major contiguous. Partial
  // products travel in config.dtype (as a reduce-scatter in that dtype would move them) and are
  // summed in f32, for block b in the order of ranks b-1, b-2, ..., b+1, then b's own (the same
  // order for ring and all-pairs). Collective.
  void run(const Tensor& A, const Tensor& B, const Tensor& C);
  // The baseline: one GEMM, then the reduce-scatter (or one of the two, see SerialStep).
  void run_serial(const Tensor& A, const Tensor& B, const Tensor& C,
                  SerialStep step = SerialStep::both);
  // run()'s piece-by-piece GEMMs alone, into private memory; C is not written. Local; for
  // benchmarks.
  void run_gemm_only(const Tensor& A, const Tensor& B, const Tensor& C);

  bool overlaps() const;  // as AllGatherGemm::overlaps()
  // Bytes this op allocated per rank: symmetric buffer, signals, f32 partial products, staging.
  size_t workspace_bytes() const;
  const OverlapConfig& config() const;

 private:
  std::unique_ptr<detail::OverlapOp> op_;
};

}  // namespace pmoe
