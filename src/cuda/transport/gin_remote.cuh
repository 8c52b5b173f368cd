// The GPU remote path (nvcc with NCCL's device API): RemotePath on GIN, as
// src/cuda/transport/remote_path.cuh lists what a flavour defines (and picks this one). Every call
// is thread-level: the calling thread issues it alone, through GIN context `context`.
//
//   this rank's window (NcclGin)                 peer's window
//   ┌────────────┬──────────────┐   GIN put      ┌────────────┬──────────────┐
//   │ region     │ direct sigs  │ ─────────────► │ region     │ direct sigs  │
//   │ src_offset │              │  (NIC reads    │ dst_offset │              │
//   └────────────┴──────────────┘   the window)  └────────────┴──────────────┘
//                                     then +1 ─► peer's GIN signal `slot` (NCCL's memory)
//
// Ordering, GIN's and no more: a signal added by put_signal or signal_add is seen at the peer
// only after the payload of that put and of every earlier put of the same context to the same
// peer (a *strong* signal, in 2.30's words: combine's signal covers rows put before it without
// one, so 2.30's WeakSignalAdd, which covers its own put only, would not do). Nothing orders puts
// to different peers, nor a later put against an earlier signal. A put's source may be rewritten
// after the flush of the thread that issued it.
// Offsets are bytes from the window's start, which is the region's start.
//
// Compile-checked only (sm_80, sm_90a): no GPU and no NIC has run it yet.
#pragma once

#include <nccl.h>
#include <nccl_device.h>

#include <cstddef>
#include <cstdint>

#include "cuda/flavor.hpp"
#include "cuda/transport/nccl_compat.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

// Travels by value in the kernels' params (ncclDevComm is a plain struct of device pointers and
// counts, as NCCL passes it to its own kernels).
struct RemotePath {
  ncclDevComm comm;     // NcclGin::dev_comm()
  ncclWindow_t window;  // NcclGin::window(); nullptr: this run has no remote peer
  int context;          // the GIN context of every put, signal and read (0: the only one made)
};

// True where remote puts can be issued; elsewhere every call below returns false (or 0) and
// moves nothing, for the transport to report instead of crashing.
__device__ __forceinline__ bool remote_ready(const RemotePath& path) {
  return path.window != nullptr;
}

// `bytes` from this rank's window at src_offset into `peer`'s (a world rank) at dst_offset; with
// slot >= 0, then peer's GIN signal `slot` += 1, seen after this put's payload and every earlier
// put of this context to that peer. The source bytes must be visible to the calling thread (a
// __syncthreads after the block wrote them): GIN releases them at device scope before the NIC
// reads.
__device__ __forceinline__ bool remote_put(const RemotePath& path, int peer, size_t dst_offset,
                                           size_t src_offset, size_t bytes, int slot) {
  if (!remote_ready(path)) return false;
  ncclGin gin(path.comm, path.context);
  const ncclTeam world = ncclTeamWorld(path.comm);
  if (slot >= 0) {
    gin.put(world, peer, path.window, dst_offset, path.window, src_offset, bytes,
            GinSignalAdd{ncclGinSignal_t(slot), 1});
  } else {
    gin.put(world, peer, path.window, dst_offset, path.window, src_offset, bytes);
  }
  return true;
}

// peer's GIN signal `slot` += 1, no payload, ordered after earlier puts of this context to it.
__device__ __forceinline__ bool remote_signal_add(const RemotePath& path, int peer, int slot) {
  if (!remote_ready(path)) return false;
  ncclGin gin(path.comm, path.context);
  gin.signal(ncclTeamWorld(path.comm), peer, GinSignalAdd{ncclGinSignal_t(slot), 1});
  return true;
}

// Returns once every put this thread issued on the context has left its source (which may then
// be rewritten); says nothing about arrival at the peer.
__device__ __forceinline__ bool remote_flush(const RemotePath& path) {
  if (!remote_ready(path)) return true;  // nothing was put
  ncclGin gin(path.comm, path.context);
  gin.flush(ncclCoopThread());
  return true;
}

// This rank's GIN signal `slot`, read with acquire: the payloads it covers are visible after it.
// It starts where NCCL left it (gin.h names no value): callers count from the baseline read when
// the op was built (signal_baseline.cuh). 0 where there is no remote path.
__device__ __forceinline__ uint64_t remote_signal_value(const RemotePath& path, int slot) {
  if (!remote_ready(path)) return 0;
  ncclGin gin(path.comm, path.context);
  return gin.readSignal(ncclGinSignal_t(slot));
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
