// Where the NCCL releases pmoe builds against differ, in one place: the CUDA toolkit's 2.28 and
// the pip wheel's 2.30 (nvidia-nccl-cu13, the NCCL torch loads). CMake picks the headers
// (PMOE_NCCL_HEADERS, docs/gpu.md "NCCL flavours"); everything else reads these names.
//
//   what                          2.28                       2.29 on / 2.30.7 on
//   ncclDevCommRequirements       plain data, zeroed         size, magic, version: NCCL refuses
//                                                            it unless made by the initializer
//   the signal add of put/signal  ncclGin_SignalAdd          2.30.7: ncclGin_StrongSignalAdd
//                                                            (SignalAdd deprecated; its strength
//                                                            follows ginStrongLegacySignals)
//   GIN signals, contexts         gin_limits() in gin_bootstrap.hpp (plain C++, tested)
//   the libnccl that may run it   nccl_release_mismatch() in gin_bootstrap.hpp
#pragma once

#include <nccl.h>
#include <nccl_device.h>

#include <cstring>

#include "cuda/flavor.hpp"
#include "cuda/transport/gin_bootstrap.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

// Until 2.29.2 a device communicator had at most NCCL_GIN_MAX_CONTEXTS contexts; 2.29.7 caps
// connections (NCCL_GIN_MAX_CONNECTIONS) instead, and makes as many contexts as asked.
#ifdef NCCL_GIN_MAX_CONTEXTS
static_assert(kGinMaxContexts == NCCL_GIN_MAX_CONTEXTS);
#endif

// Requirements with nothing asked (no barriers, multimem or LL A2A), for the caller to fill.
inline ncclDevCommRequirements nccl_dev_comm_requirements() {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
  ncclDevCommRequirements requirements = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 7)
  // The strong signal add below is what pmoe's kernels use (the initializer's default, said
  // here so that it is not lost): NCCL refuses a GIN plugin without it at ncclDevCommCreate.
  requirements.ginStrongSignalsRequired = true;
#endif
#else
  ncclDevCommRequirements requirements;
  std::memset(&requirements, 0, sizeof requirements);
#endif
  return requirements;
}

// The signal add pmoe's puts and signals carry: seen at the peer only after the payload of that
// put and of every earlier put of the same context to that peer (2.28's SignalAdd, 2.30's
// StrongSignalAdd; 2.30's WeakSignalAdd covers the bundled put alone, too weak for pmoe).
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 7)
using GinSignalAdd = ncclGin_StrongSignalAdd;
#else
using GinSignalAdd = ncclGin_SignalAdd;
#endif

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
