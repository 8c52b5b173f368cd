// The device side of pmoe's transport: what a kernel calls to move bytes and signals to a peer,
// direct (load/store) or remote (puts through the flavour's RemotePath: NCCL GIN under nvcc, the
// emulated device's proxy under the host compiler). The data it carries: transport_state.cuh.
//
//   is_direct(t, d)  -> store into t.direct[d] + offset, then signal_direct(t, d, slot, epoch)
//   otherwise        -> stage the bytes in this rank's own region (puts go window to window),
//                       put(...)/put_signal(...) to d, flush(t) before the staging is reused
//   waiting          -> wait_signal(t, slot, epoch, ...): "value >= epoch" means "this call's
//                       data is here", whether a direct peer stored the epoch or a remote one
//                       added 1 per call to GIN's signal (counted from t.remote_baseline).
//
// Ordering (exactly GIN's): a remote signal becomes visible only after the payloads of its put
// and of every earlier put of this rank to that peer. Nothing orders puts to one peer against
// puts to another, nor a put against a store to a direct peer.
#pragma once

#include "cuda/all_to_all/device_utils.cuh"  // first: see params.cuh
#include "cuda/transport/transport_state.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

__device__ __forceinline__ int node_of(const Transport& t, int rank) {
  return rank / t.ranks_per_node;
}
__device__ __forceinline__ bool is_direct(const Transport& t, int peer) {
  return t.direct[peer] != nullptr;
}

// The word of this rank's signal `slot`.
__device__ __forceinline__ uint64_t* local_signal(const Transport& t, int slot) {
  return t.local_signals + size_t(slot) * t.signal_stride;
}

// Thread-level: one put of `bytes` from this rank's region at src_offset into the remote peer's
// region at dst_offset. False (nothing sent) where the path cannot reach the peer.
__device__ __forceinline__ bool put(const Transport& t, int peer, size_t dst_offset,
                                    size_t src_offset, size_t bytes) {
  return remote_put(t.remote, peer, dst_offset, src_offset, bytes, -1);
}

// The same put, then the peer's signal `slot` += 1, visible there after this put and every
// earlier put of this rank to that peer.
__device__ __forceinline__ bool put_signal(const Transport& t, int peer, size_t dst_offset,
                                           size_t src_offset, size_t bytes, int slot) {
  return remote_put(t.remote, peer, dst_offset, src_offset, bytes, slot);
}

// The peer's signal `slot` += 1, ordered after this rank's earlier puts to that peer.
__device__ __forceinline__ bool signal_add(const Transport& t, int peer, int slot) {
  return remote_signal_add(t.remote, peer, slot);
}

// Until every put *this thread* issued has left its source (the source may be reused then):
// GIN's flush(ncclCoopThread). Another thread's puts are not covered, and nothing is known to
// have landed at the peer.
__device__ __forceinline__ void flush(const Transport& t) { (void)remote_flush(t.remote); }

// A direct peer's signal `slot` set to `value` with a release (of device scope where the peers
// share this GPU, else system): every store of this thread before it (and of others, fenced
// before) is visible to the peer once it sees the value.
__device__ __forceinline__ void signal_direct(const Transport& t, int peer, int slot,
                                              uint64_t value) {
  signal_release(t.direct_signals[peer] + size_t(slot) * t.signal_stride, value, t.same_device);
}

// This rank's signal `slot`: the larger of what direct writers stored and what remote ones added
// since the op was built (a slot has one writer, so the other is 0: GIN's word counts from its
// baseline, pmoe's is never stored by a remote peer).
__device__ __forceinline__ uint64_t read_signal(const Transport& t, int slot) {
  const uint64_t stored = signal_acquire(local_signal(t, slot), t.same_device);
  const uint64_t added = remote_signal_value(t.remote, slot) - t.remote_baseline[slot];
  return stored > added ? stored : added;
}

// Bounded wait on one of this rank's own slots: true once its value >= least; false after
// timeout_ns, having reported kTimeout naming `peer` (the host message names its node), or once
// another thread reported a fatal error.
__device__ __forceinline__ bool wait_signal(const Transport& t, int slot, uint64_t least,
                                           uint64_t timeout_ns, ErrorWord* error, int peer,
                                           Step step, int32_t awaited = kAwaitedData) {
  return wait_until_at_least([&t, slot] { return read_signal(t, slot); }, least, timeout_ns,
                             error, peer, step, awaited);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
