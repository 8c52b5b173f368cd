// Stores that another block, kernel or rank reads: the one place where the two compilations of a
// kernel differ in how such a store is made (src/cuda/launch.cuh is the other header that may
// branch on the flavour). Kernel code calls store_to_peer() and never branches itself.
//
//   under nvcc:               a plain store (st.global), exactly what `*dst = value` compiles to
//   on the emulated device:   PMOE_EMU_LATE_STORES=1: held back in the block's pending stores
//                             until the CUDA memory model says they must be visible
//                             (src/cuda/emulator/late_stores.hpp); otherwise a plain store
//
// What releases a held store (so what a kernel must do before a peer may read it):
//   - a fence or a release store (release, acq_rel or seq_cst) of device or system scope by the
//     same thread: __threadfence(), __threadfence_system(), cuda::atomic_ref<.., device|system>
//     .store(.., release) -- cumulative: it also releases the stores of the other threads of its
//     block made before a __syncthreads() that this thread passed since;
//   - the end of the kernel (so the next kernel in stream order, an event, a stream or device
//     synchronisation see them).
// What does not: a relaxed atomic (store or read-modify-write; CUDA's atomicAdd & co. are
// relaxed), __threadfence_block() or a block-scope release, a __syncthreads() on its own.
// Released stores are still invisible to a reader until it acquires where they were released
// (an acquire load of the signal, or a relaxed read of it and then a fence of device or system
// scope), as on a GPU whose reader may hold stale lines otherwise; the kernel's end delivers them
// too. A fence followed by a relaxed atomic write (last_block's atomicAdd) counts as a release.
// A thread that reads back what it (or its block) stored this way must fence first: the emulated
// device does not let even the block see a held store (stricter than CUDA for the block; no
// pmoe kernel reads such a store back within its block).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/flavor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

// *dst = value, for memory that other blocks, kernels or ranks read once this thread releases it
// (see above). T is a word of at most 16 bytes (int4 and below).
template <typename T>
__device__ __forceinline__ void store_to_peer(T* dst, const std::type_identity_t<T>& value) {
  static_assert(sizeof(T) <= 16, "store_to_peer stores one word of at most 16 bytes");
#if defined(__CUDACC__)
  *dst = value;
#else
  ::pmoe::emu::count_bytes_written(sizeof(T));
  ::pmoe::emu::store_late(dst, value);
#endif
}

// Loads and stores of rows (payloads, expert rows, sums): plain ones under nvcc, counted by the
// emulated device (include/pmoe/diagnostics/kernel_counts.hpp), so that the bytes an op moves
// are measured where they move and not restated beside the loops. store_global is for memory
// that only later kernels (or the host) read; what a peer or another block reads goes through
// store_to_peer.
template <typename T>
__device__ __forceinline__ T load_global(const T* src) {
#if !defined(__CUDACC__)
  ::pmoe::emu::count_bytes_read(sizeof(T));
#endif
  return *src;
}
template <typename T>
__device__ __forceinline__ void store_global(T* dst, const std::type_identity_t<T>& value) {
#if !defined(__CUDACC__)
  ::pmoe::emu::count_bytes_written(sizeof(T));
#endif
  *dst = value;
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
