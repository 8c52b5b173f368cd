// Late stores on the emulated device (PMOE_EMU_LATE_STORES=1): what store_to_peer()
// (src/cuda/memory_ops.cuh) stores is held back, per block, until CUDA's memory model says it
// must be visible to other blocks and ranks, so a kernel that signals before it releases its data
// reads stale bytes in a plain run (x86 would otherwise keep every store in order):
//
//   store_to_peer(p, v)      held in the block's list, tagged with the storing thread and the
//                            number of __syncthreads() the block has passed
//   release at location X   (a release, acq_rel or seq_cst store or read-modify-write of device
//                            or system scope, by thread f) takes f's held stores, every held
//                            store of its block made before a barrier f has passed (cumulative
//                            over what bar.sync showed f) and what f's fences released, as one
//                            package pending at X: still invisible
//   fence                    (__threadfence(), __threadfence_system(), by f) releases the same
//                            stores to f's next atomic write (fence then relaxed store or
//                            atomicAdd = a release, PTX), which makes them a package at its
//                            location; and acquires what f's relaxed atomic reads observed since
//                            its last fence (below)
//   acquire at X             (an acquire, acq_rel or seq_cst load or read-modify-write of device
//                            or system scope; or a relaxed atomic read of X, then a fence by the
//                            same thread) writes the packages pending at X: a reader that does
//                            not acquire where the writer released reads stale bytes
//   block end                the block's list joins its launch's list
//   kernel end               after PMOE_EMU_LATE_STORE_DELAY_US (default 200 us), the launch's
//                            list and its packages no reader took are written, before anything
//                            later in the stream runs (so events and stream syncs see them)
//
// Not released by: __threadfence_block(), block-scope atomics, __syncthreads() alone; an atomic
// read that is relaxed, or of block scope, acquires nothing. Held stores are invisible to every
// thread, the storing one included, until released (stricter than CUDA within a block; see
// memory_ops.cuh). Once a process has used CUDA IPC the reader side is off (a package's reader
// may be in another process): released stores are then written at the release, as before.
// Packages are kept per location, so an acquire writes them for every reader at once (a reader
// that acquires nothing still sees what another reader acquired: weaker than CUDA, never
// stricter).
// A host thread's acquire (a cuda::atomic_ref load of a host-mapped word) writes the packages
// pending where it reads, as a kernel thread's does; what the host sees of the atomic stores
// themselves is host_view.hpp's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace pmoe::emu {

// PMOE_EMU_LATE_STORES=1 (read once).
bool late_stores_enabled();

// Holds `bytes` (at most 16) for `dst` in the calling kernel thread's block; outside a kernel,
// or with late stores off, stores at once.
void hold_store(void* dst, const void* value, size_t bytes);

// Writes now the stores a release of device or system scope by the calling kernel thread would
// publish, and those its fences released: for emulator code that hands them to another host
// thread on the kernel thread's behalf.
void release_held_stores();
// Writes now the stores the calling kernel thread's fences released (a remote put, whose proxy
// reads its source later on its own host thread: the put is ordered after the fence on a GPU).
void write_fenced_stores();

// The memory-model hooks of device_api.hpp and atomic.hpp (calling kernel thread; no-ops with
// late stores off or outside a kernel).
void fence_of_device_scope();                          // __threadfence(), __threadfence_system()
void atomic_write_at(const void* at, bool releases);   // before an atomic write of device scope+
void atomic_read_at(const void* at, bool acquires);    // after an atomic read of device scope+
// CUDA IPC in use in this process (memory.cpp): the reader side is off from now on.
void late_stores_shared_across_processes();

// Ends the process with a "misaligned address" report (misaligned_access.cpp): a GPU faults on
// such an access.
[[noreturn]] void misaligned_store(const void* dst, size_t bytes, size_t alignment);

template <typename T>
void store_late(T* dst, const T& value) {
  // Checked here, not left to UBSan's alignment check: a held store is written later, bytewise.
  if (reinterpret_cast<uintptr_t>(dst) % alignof(T) != 0)
    misaligned_store(dst, sizeof(T), alignof(T));
  if (!late_stores_enabled()) {
    *dst = value;
    return;
  }
  hold_store(dst, &value, sizeof(T));
}

// The stores of a launch's ended blocks, written at the kernel's end (grid.cpp).
class LaunchHeldStores {
 public:
  LaunchHeldStores();
  ~LaunchHeldStores();
  void kernel_end();  // waits the delay (if anything is held), then writes them in order
 private:
  friend void late_stores_block_end(LaunchHeldStores&);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Hooks of the block runner (grid.cpp), on the block's host thread.
void late_stores_block_start(const LaunchHeldStores& launch);  // before the block's first thread
void late_stores_barrier_passed();                // every thread of the block passed a barrier
void late_stores_block_end(LaunchHeldStores& launch);  // the block returned

}  // namespace pmoe::emu
