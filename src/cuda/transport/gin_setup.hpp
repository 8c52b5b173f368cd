// The GIN state's hook for the CUDA backend (nvcc builds only), declared without NCCL's types so
// that the backend compiles alike with and without NCCL: defined by nccl_gin.cu where CMake found
// NCCL's device API, by no_nccl_gin.cu (which refuses) where it did not. The nvcc branch of
// remote_setup.hpp is where it is to be called; as the region must be NCCL's window (memory from
// ncclMemAlloc, which cudaMalloc'd alloc_symmetric memory is not), it replaces alloc_symmetric
// for a world with remote peers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/flavor.hpp"
#include "cuda/transport/gin_bootstrap.hpp"
#include "pmoe/comm.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

class NcclGin;      // src/cuda/transport/nccl_gin.hpp
struct RemotePath;  // src/cuda/transport/remote_path.cuh picks the flavour
struct NcclGinDeleter {
  void operator()(NcclGin* gin) const;
};
using NcclGinHandle = std::unique_ptr<NcclGin, NcclGinDeleter>;

// True where this build has NCCL's device API, so that open_gpu_remote_path() can work.
bool gpu_remote_path_built();

// Collective: the NCCL state of the remote path for one AllToAll (its layout's region bytes and
// signal slots, the node split), made as NcclGin's constructor says. Throws pmoe::Error: bad
// request (before any NCCL call), an NCCL call that failed (named), or, in a build without NCCL's
// device API, on every rank alike, that the remote path is not built in.
NcclGinHandle open_gpu_remote_path(Communicator& comm, const GinRequest& request);

// What the backend puts into its kernels' params from the GIN state, in place of what
// alloc_symmetric gives on one node: this rank's region and signal words, and for every peer on
// this node its region and signal words for load/store (nullptr for peers on other nodes, which
// only `remote` reaches). Reads NCCL's LSA table on `stream` and waits for it.
struct RemoteWiring {
  std::byte* region = nullptr;
  uint64_t* signals = nullptr;
  std::vector<std::byte*> direct_regions;
  std::vector<uint64_t*> direct_signals;
};
RemoteWiring wire_gpu_remote_path(const NcclGin& gin, cudaStream_t stream);
// The RemotePath of `gin` (its device communicator, window, GIN context 0).
void fill_remote_path(const NcclGin& gin, RemotePath& remote);

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
