// What the kernels carry to reach their peers (the contract: /docs/gpu-all-to-all.md, "Remote
// peers"): every rank has one symmetric region and one signal array. A peer is *direct* (its
// region is load/store reachable: same GPU, CUDA IPC, NCCL LSA) or *remote* (another node: only
// puts and signal adds through the RemotePath).
//
//   rank r                         peer d, direct                 peer d, remote
//   region --load/store-------->   direct[d] (its region)
//   region[src_offset] --put---------------------------------->   region_d[dst_offset]
//   signal add ------------------------------------------------>   GIN's signal `slot` at d (+= 1)
//
// Data only, so that AllToAllParams can hold it; the functions are in transport.cuh.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/flavor.hpp"
#include "cuda/transport/remote_path.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

constexpr int kMaxRanks = 64;  // ranks one op spans on the CUDA backend (pointer tables below)

struct Transport {
  int rank, world_size, ranks_per_node;  // node of r = r / ranks_per_node
  std::byte* direct[kMaxRanks];          // peer r's region for load/store, or nullptr (remote)
  uint64_t* direct_signals[kMaxRanks];   // peer r's signal array for release stores, or nullptr
  uint64_t* local_signals;               // this rank's signal array (read and waited on here)
  int signal_stride;                     // u64 words between two signal slots
  // Every direct peer is on this rank's GPU (ranks sharing it in one process): signals and the
  // fences before them need device scope only.
  bool same_device;
  RemotePath remote;                     // flavour-specific: remote_path.cuh
  // [slot]: what remote_signal_value read for this rank's slot when the op was built, before any
  // peer could add (GIN's signals start where NCCL leaves them; gin.h promises no 0). Device.
  const uint64_t* remote_baseline;
};

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
