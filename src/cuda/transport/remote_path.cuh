// The one place that picks the remote path's flavour, as src/cuda/launch.cuh picks the launch
// (kernel code has no #ifdef). Each flavour defines, in namespace pmoe::cuda::PMOE_CUDA_FLAVOR:
//
//   struct RemotePath;                         // by value in Transport; zero = no remote peer
//   // Each returns false if this path cannot reach a remote peer (no NCCL device API, a
//   // single-node run): the transport then reports an error instead of crashing.
//   __device__ bool remote_put(const RemotePath&, int peer, size_t dst_offset,
//                              size_t src_offset, size_t bytes, int slot);  // slot < 0: none
//   __device__ bool remote_signal_add(const RemotePath&, int peer, int slot);
//   __device__ bool remote_flush(const RemotePath&);  // the calling thread's puts' sources only
//   // This rank's signal `slot` in the path's own words (GIN's readSignal): it starts at a value
//   // nobody promises, so callers count from a baseline read before any peer added
//   // (Transport::remote_baseline); 0 where the path has no signals of its own.
//   __device__ uint64_t remote_signal_value(const RemotePath&, int slot);
//
// Ordering (GIN's, no stronger): a slot's add becomes visible at the peer only after the payloads
// of that put and of every earlier put of the same rank to the same peer; a later put may land
// before it.
//
//   nvcc, NCCL's device API found  gin_remote.cuh: NCCL GIN (compile-checked only)
//   nvcc without it                no_remote.cuh: no peer is ever remote; puts return false
//   the host compiler              the emulated device's proxy (src/cuda/emulator/remote*)
//
// CMake defines PMOE_HAVE_NCCL_GIN=1 for the nvcc sources where it found NCCL >= 2.28.7 (the
// file's presence is not enough: gin_remote.cuh needs nccl_device.h).
#pragma once

#if defined(__CUDACC__)
#if defined(PMOE_HAVE_NCCL_GIN) && PMOE_HAVE_NCCL_GIN
#include "cuda/transport/gin_remote.cuh"
#else
#include "cuda/transport/no_remote.cuh"
#endif
#else
#include "cuda/emulator/remote_path.hpp"
#endif
