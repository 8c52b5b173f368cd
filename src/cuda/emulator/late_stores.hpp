// Late stores on the emulated device (PMOE_EMU_LATE_STORES=1): what store_to_peer()
// (src/cuda/memory_ops.cuh) stores is held back, per block, until CUDA's memory model says it
// must be visible to other blocks and ranks, so a kernel that signals before it releases its data
// reads stale bytes in a plain run (x86 would otherwise keep every store in order):
//
//   store_to_peer(p, v)      held in the block's list, tagged with the storing thread and the
//                            number of __syncthreads() the block has passed
//   fence / release store    (device or system scope, by thread f) writes f's held stores and
//                            every held store of its block made before a barrier f has passed
//                            (a fence is cumulative over what bar.sync showed the thread)
//   block end                the block's list joins its launch's list
//   kernel end               after PMOE_EMU_LATE_STORE_DELAY_US (default 200 us), the launch's
//                            list is written, before anything later in the stream runs
//
// Not released by: relaxed atomics (atomicAdd & co.), __threadfence_block(), block-scope
// release, __syncthreads() alone. Held stores are invisible to every thread, the storing one
// included, until released (stricter than CUDA within a block; see memory_ops.cuh).
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

// A fence or release of device or system scope by the calling kernel thread.
void release_held_stores();

template <typename T>
void store_late(T* dst, const T& value) {
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
void late_stores_barrier_passed();                // every thread of the block passed a barrier
void late_stores_block_end(LaunchHeldStores& launch);  // the block returned

}  // namespace pmoe::emu
