// Where the CUDA backend makes the GPU remote path: the hook it calls when a CUDA communicator's
// ranks span nodes (nvcc builds only; the emulated device has its own remote path). Declared
// without NCCL's types, so that the backend compiles alike with and without NCCL: the hook is
// defined by src/cuda/transport/nccl_gin.cu where CMake found NCCL's device API, and by
// src/cuda/transport/no_nccl_gin.cu, which refuses, where it did not.
#pragma once

#include <memory>

#include "cuda/flavor.hpp"
#include "cuda/transport/gin_bootstrap.hpp"
#include "pmoe/comm.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

class NcclGin;  // src/cuda/transport/nccl_gin.hpp
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

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
