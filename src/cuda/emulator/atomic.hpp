// cuda::atomic_ref on the emulated device: std::atomic_ref with the same memory orders, so the C++
// memory model (and ThreadSanitizer) judges the kernels' synchronisation. Every scope maps to the
// same host atomics; with late stores on (late_stores.hpp), a release (release, acq_rel or
// seq_cst) of device or system scope also releases the calling thread's held stores to this
// location, and an acquire of that scope takes what was released here, while a relaxed one or
// one of block scope does neither, so a scope or order too weak on either side shows as stale
// data. Stores of system scope to host-mapped memory, and the host's loads of it, also keep the
// order in which the host may see them (host_view.hpp).
#pragma once

#include <atomic>

#include "cuda/emulator/host_view.hpp"
#include "cuda/emulator/late_stores.hpp"

namespace pmoe::emu {
void count_system_fence();  // kernel_counts.hpp: a release of system scope by a kernel thread
}  // namespace pmoe::emu

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
  explicit atomic_ref(T& object) : object_(&object), ref_(object) {}
  T load(memory_order order = memory_order_seq_cst) const {
    T value = ref_.load(order);
    read(order);
    if (Scope == thread_scope_system)  // a host thread's load of a host-mapped word (host_view.hpp)
      ::pmoe::emu::host_view_load(object_, &value, sizeof(T), acquires(order));
    return value;
  }
  void store(T value, memory_order order = memory_order_seq_cst) const {
    write(order);
    ref_.store(value, order);
  }
  T exchange(T value, memory_order order = memory_order_seq_cst) const {
    write(order);
    const T old = ref_.exchange(value, order);
    read(order);
    return old;
  }
  bool compare_exchange_strong(T& expected, T desired,
                               memory_order order = memory_order_seq_cst) const {
    write(order);
    const bool swapped = ref_.compare_exchange_strong(expected, desired, order);
    read(order);
    return swapped;
  }
  T fetch_add(T value, memory_order order = memory_order_seq_cst) const {
    write(order);
    const T old = ref_.fetch_add(value, order);
    read(order);
    return old;
  }
  T fetch_sub(T value, memory_order order = memory_order_seq_cst) const {
    write(order);
    const T old = ref_.fetch_sub(value, order);
    read(order);
    return old;
  }
  T fetch_or(T value, memory_order order = memory_order_seq_cst) const {
    write(order);
    const T old = ref_.fetch_or(value, order);
    read(order);
    return old;
  }

 private:
  static constexpr bool kBeyondTheBlock =
      Scope == thread_scope_system || Scope == thread_scope_device;
  static bool releases(memory_order order) {
    return order == memory_order_release || order == memory_order_acq_rel ||
           order == memory_order_seq_cst;
  }
  static bool acquires(memory_order order) {
    return order == memory_order_acquire || order == memory_order_acq_rel ||
           order == memory_order_seq_cst || order == memory_order_consume;
  }
  // Before the write: what its release half (or the thread's fences) publishes at this location,
  // and, to host-mapped memory, what the host sees of it (host_view.hpp).
  void write(memory_order order) const {
    if (Scope == thread_scope_system && releases(order)) ::pmoe::emu::count_system_fence();
    if (kBeyondTheBlock) ::pmoe::emu::atomic_write_at(object_, releases(order));
    if (Scope == thread_scope_system) {
      const T before = ref_.load(memory_order_relaxed);
      ::pmoe::emu::host_view_store(object_, &before, sizeof(T), releases(order));
    }
  }
  // After the read: what its acquire half takes from this location (late_stores.hpp).
  void read(memory_order order) const {
    if (kBeyondTheBlock) ::pmoe::emu::atomic_read_at(object_, acquires(order));
  }
  T* object_;
  std::atomic_ref<T> ref_;
};

}  // namespace cuda
