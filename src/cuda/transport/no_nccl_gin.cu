// The GPU remote path's hook in a build where CMake found no NCCL with the device API
// (nccl_device.h and libnccl): every rank refuses alike, before any collective step, so that no
// rank waits for a peer that went on.
#include "cuda/transport/gin_setup.hpp"

#include "cuda/transport/remote_path.cuh"
#include "pmoe/error.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

bool gpu_remote_path_built() { return false; }

NcclGinHandle open_gpu_remote_path(Communicator& comm, const GinRequest& request) {
  // No NCCL, so no limits of its own: the request's fields alone are checked, on every rank.
  GinLimits unlimited;
  unlimited.signal_pool = request.signal_slots > 0 ? request.signal_slots : 1;
  unlimited.contexts = kGinMaxContexts;
  check_gin_request(comm, request, unlimited);
  throw Error(detail::cat("GIN remote path: rank ", comm.rank(), "'s ranks span ",
                          comm.size() / request.ranks_per_node,
                          " nodes, but this pmoe was built "
                          "without NCCL's device API (NCCL >= 2.28 with nccl_device.h); rebuild "
                          "where CMake finds it (its configure output says)"));
}

void NcclGinDeleter::operator()(NcclGin*) const {}

// Unreachable: open_gpu_remote_path never returns a state here.
RemoteWiring wire_gpu_remote_path(const NcclGin&, cudaStream_t) {
  throw Error("GIN remote path: not built in (no NCCL device API)");
}
void fill_remote_path(const NcclGin&, RemotePath& remote) { remote = RemotePath{}; }

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
