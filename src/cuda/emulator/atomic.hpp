// cuda::atomic_ref on the emulated device: std::atomic_ref with the same memory orders, so the C++
// memory model (and ThreadSanitizer) judges the kernels' synchronisation. Every scope maps to the
// same host atomics; with late stores on (late_stores.hpp), a release (release, acq_rel or
// seq_cst) of device or system scope also releases the calling thread's held stores, while a
// relaxed one or one of block scope does not, so a scope too narrow shows as stale data.
#pragma once

#include <atomic>

#include "cuda/emulator/late_stores.hpp"

namespace cuda {

enum thread_scope { thread_scope_system, thread_scope_device, thread_scope_block, thread_scope_thread };

using memory_order = std::memory_order;
inline constexpr memory_order memory_order_relaxed = std::memory_order_relaxed;
inline constexpr memory_order memory_order_consume = std::memory_order_consume;
inline constexpr memory_order memory_order_acquire = std::memory_order_acquire;
inline constexpr memory_order memory_order_release = std::memory_order_release;
inline constexpr memory_order memory_order_acq_rel = std::memory_order_acq_rel;
inline constexpr memory_order memory_order_seq_cst = std::memory_order_seq_cst;

template <typename T, thread_scope Scope = thread_scope_system>
class atomic_ref {
 public:
  explicit atomic_ref(T& object) : ref_(object) {}
  T load(memory_order order = memory_order_seq_cst) const { return ref_.load(order); }
  void store(T value, memory_order order = memory_order_seq_cst) const {
    release(order);
    ref_.store(value, order);
  }
  T exchange(T value, memory_order order = memory_order_seq_cst) const {
    release(order);
    return ref_.exchange(value, order);
  }
  bool compare_exchange_strong(T& expected, T desired,
                               memory_order order = memory_order_seq_cst) const {
    release(order);
    return ref_.compare_exchange_strong(expected, desired, order);
  }
  T fetch_add(T value, memory_order order = memory_order_seq_cst) const {
    release(order);
    return ref_.fetch_add(value, order);
  }
  T fetch_sub(T value, memory_order order = memory_order_seq_cst) const {
    release(order);
    return ref_.fetch_sub(value, order);
  }
  T fetch_or(T value, memory_order order = memory_order_seq_cst) const {
    release(order);
    return ref_.fetch_or(value, order);
  }

 private:
  // What the release half of `order` publishes at this scope (late_stores.hpp).
  static void release(memory_order order) {
    const bool releases = order == memory_order_release || order == memory_order_acq_rel ||
                          order == memory_order_seq_cst;
    if (releases && (Scope == thread_scope_system || Scope == thread_scope_device))
      ::pmoe::emu::release_held_stores();
  }
  std::atomic_ref<T> ref_;
};

}  // namespace cuda
