// What a device overlap op holds besides its symmetric memory: the rank's compute stream (the
// communicator's stream()) and copy stream (its side_stream()), one event per piece (between
// the two), fork and join events, a cuBLAS handle bound to the compute stream, the host-mapped
// fault word that the signal waits write on a timeout (signals.cuh), and how pieces are copied:
// by the copy engines (cudaMemcpyAsync, the default) or, with PMOE_OVERLAP_COPY=kernel, by a
// copy kernel on kCopyBlocks blocks (copy_kernel.cuh), so that a GPU can measure both.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "core/device_runtime.hpp"
#include "cuda/check.hpp"
#include "cuda/flavor.hpp"
#include "cuda/gemm/cublas_gemm.hpp"
#include "cuda/overlap/copy_kernel.cuh"
#include "cuda/overlap/signals.cuh"
#include "cuda/sm_count.hpp"
#include "pmoe/comm.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

// How the overlap ops copy a piece; PMOE_OVERLAP_COPY names it ("engine", the default, or
// "kernel"), read when an op is built. Throws pmoe::Error for another value.
inline bool copy_by_kernel_from_env() {
  const char* text = std::getenv("PMOE_OVERLAP_COPY");
  const std::string_view value = text ? text : "";
  PMOE_CHECK(value.empty() || value == "engine" || value == "kernel",
             "PMOE_OVERLAP_COPY must be engine or kernel, got '", value, "'");
  return value == "kernel";
}

class OverlapStreams {
 public:
  OverlapStreams(Communicator& comm, int events)
      : device_(comm.device()),
        compute_(static_cast<cudaStream_t>(comm.stream().handle)),
        timeout_ns_(uint64_t(comm.timeout_s() * 1e9)),
        copy_by_kernel_(copy_by_kernel_from_env()) {
    detail::set_device(device_);
    copy_ = static_cast<cudaStream_t>(comm.side_stream().handle);
    events_.resize(size_t(events));
    for (cudaEvent_t& e : events_) PMOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    PMOE_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    PMOE_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
    blocks_ = grid_blocks(sm_count(device_.index));
    PMOE_CUBLAS_CHECK(cublasCreate(&cublas_));
    PMOE_CUBLAS_CHECK(cublasSetStream(cublas_, compute_));
  }
  ~OverlapStreams() {
    (void)cudaStreamSynchronize(copy_);
    (void)cudaStreamSynchronize(compute_);
    if (cublas_) (void)cublasDestroy(cublas_);
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    (void)cudaEventDestroy(fork_);
    (void)cudaEventDestroy(join_);
  }
  OverlapStreams(const OverlapStreams&) = delete;
  OverlapStreams& operator=(const OverlapStreams&) = delete;

  cudaStream_t compute() const { return compute_; }
  cudaStream_t copy() const { return copy_; }
  cublasHandle_t cublas() const { return cublas_; }
  cudaEvent_t piece_event(int i) const { return events_[size_t(i)]; }
  OverlapFault* fault() const { return fault_.device(); }
  uint64_t timeout_ns() const { return timeout_ns_; }
  int blocks() const { return blocks_; }  // grid of an element-wise kernel over the device

  // A piece from `src` (a peer's symmetric memory, or local) to `dst` on `stream`: a
  // copy-engine copy, or the copy kernel (PMOE_OVERLAP_COPY=kernel).
  void copy_piece(void* dst, const void* src, size_t bytes, cudaStream_t stream) const {
    if (copy_by_kernel_)
      copy_with_kernel(dst, src, bytes, stream);
    else
      PMOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  }
  bool copies_by_kernel() const { return copy_by_kernel_; }
  size_t bytes() const { return sizeof(OverlapFault); }

  // The copy stream starts after what the compute stream holds (the caller's A and B).
  void fork() {
    PMOE_CUDA_CHECK(cudaEventRecord(fork_, compute_));
    PMOE_CUDA_CHECK(cudaStreamWaitEvent(copy_, fork_, 0));
  }
  // The compute stream goes on only once the copy stream's work of this call is done.
  void join() {
    PMOE_CUDA_CHECK(cudaEventRecord(join_, copy_));
    PMOE_CUDA_CHECK(cudaStreamWaitEvent(compute_, join_, 0));
  }

  // A wait of an earlier call that timed out: the protocol is broken (the front end retires
  // the op). Read without synchronising; a timeout is seen at the latest by the call after.
  void throw_if_faulted(const char* op, int rank) const {
    const std::optional<OverlapFault> fault = fault_.read();
    if (!fault) return;
    throw Error(detail::cat(op, " on rank ", rank, " (", device_.str(), "): rank ", fault->peer,
                            fault->what == kWaitDone ? " did not finish reading the previous call"
                                              : " did not deliver a piece",
                            " within ", timeout_ns_ / 1e9, " s"));
  }

 private:
  Device device_;
  cudaStream_t compute_;
  cudaStream_t copy_ = nullptr;
  std::vector<cudaEvent_t> events_;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  FaultWord fault_;
  cublasHandle_t cublas_ = nullptr;
  uint64_t timeout_ns_;
  bool copy_by_kernel_;
  int blocks_ = 1;
};

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
