// An op's symmetric memory where its GPU ranks span nodes (nvcc builds): NCCL's window in place of
// what alloc_symmetric gives on one node, because GIN puts only from and into a registered window
// (ncclMemAlloc memory; cudaMalloc'd memory cannot be registered). The kernels see it as they see
// alloc_symmetric's memory, split into nodes:
//
//   peer(r), signal_word(r, s)   r on this node: NCCL's LSA pointer to r's window (load/store)
//                                r on another node: nullptr (GIN only: remote_setup.hpp)
//   gin()                        the NCCL state, for the kernels' RemotePath
//
// Built without NCCL's device API, open() refuses on every rank alike (no_nccl_gin.cu).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <utility>

#include "comm/agree_on_step.hpp"
#include "cuda/flavor.hpp"
#include "cuda/transport/gin_bootstrap.hpp"
#include "cuda/transport/gin_setup.hpp"
#include "pmoe/comm.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

class GinMemory final : public SymmetricMemory {
 public:
  // Collective over `comm`: opens the GIN state for `request` and reads node peers' windows on
  // `stream`, the stream of every kernel that will use the memory. A failure on any rank reaches
  // every rank before the collective teardown.
  static std::unique_ptr<GinMemory> open(Communicator& comm, const GinRequest& request,
                                         cudaStream_t stream) {
    NcclGinHandle gin = open_gpu_remote_path(comm, request);
    RemoteWiring wiring;
    ::pmoe::detail::agree_on_step(
        comm, [&] { wiring = wire_gpu_remote_path(*gin, stream); },
        "GIN remote path: node peers' windows");
    return std::unique_ptr<GinMemory>(
        new GinMemory(comm, request, std::move(gin), std::move(wiring), stream));
  }

  // The kernels that used the window are done before NCCL's collective teardown frees it.
  ~GinMemory() override {
    (void)cudaStreamSynchronize(stream_);
    gin_.reset();
  }

  const NcclGin& gin() const { return *gin_; }

 private:
  // No Group: host-side put, signal and wait refuse device memory before they would use one.
  GinMemory(Communicator& comm, const GinRequest& request, NcclGinHandle gin, RemoteWiring wiring,
            cudaStream_t stream)
      : SymmetricMemory(comm.rank(), request.region_bytes, request.signal_slots,
                        std::move(wiring.direct_regions), std::move(wiring.direct_signals),
                        nullptr, nullptr, comm.timeout_s(), comm.device()),
        gin_(std::move(gin)),
        stream_(stream) {}

  NcclGinHandle gin_;
  cudaStream_t stream_;
};

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
