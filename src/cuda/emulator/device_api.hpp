// What kernel source needs from the CUDA compiler, on the emulated device: the qualifiers, the
// built-in indices of the calling thread, barriers, atomics, fences and the arithmetic intrinsics
// pmoe's kernels call. A block's threads are fibers on one host thread (grid.cpp), so:
// - `__shared__` is `static thread_local`: one copy per host thread, and a block keeps its host
//   thread from its first instruction to its last; it is filled with garbage at every block's
//   start (shared_memory.hpp);
// - threadIdx and friends read the state of the fiber now running;
// - __syncthreads() and __nanosleep() are where a fiber hands over to the next one.
// Atomics are std::atomic_ref read-modify-writes with acq_rel order (CUDA's are relaxed; the
// stronger order keeps ThreadSanitizer, which does not model fences, from reporting the kernels'
// fence-then-atomic handshakes); fences are seq_cst fences. With late stores on
// (late_stores.hpp), __threadfence() and __threadfence_system() also release the thread's held
// stores (and those its block's barriers showed it) to its next atomic write, and acquire what its
// relaxed atomic reads observed; __threadfence_block() does neither.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda/emulator/late_stores.hpp"
#include "cuda/emulator/runtime_api.hpp"

namespace pmoe::emu {

// The calling thread's place in its launch.
struct ThreadState {
  cuda_api::uint3 thread_idx, block_idx;
  cuda_api::dim3 block_dim, grid_dim;
};
extern thread_local ThreadState* current_thread;  // set by the fiber scheduler at each switch
inline const ThreadState& this_thread() { return *current_thread; }

void sync_threads();                   // __syncthreads()
int sync_threads_count(int predicate);  // __syncthreads_count(): how many threads passed true
void yield_thread();                   // hands the host thread to the block's next fiber
// The warp's shuffle: every live lane of the calling thread's warp hands in `word` and gets the
// word of lane `source_lane` back (its own if that is outside the warp), waiting for the others
// as at a barrier of the warp (grid.cpp).
uint64_t warp_exchange(uint64_t word, int source_lane);

// The calling thread's lane: its linear index in the block, modulo 32.
inline int lane_of_this_thread() {
  const ThreadState& t = *current_thread;
  return int((t.thread_idx.x + t.block_dim.x * (t.thread_idx.y + t.block_dim.y * t.thread_idx.z)) %
             32u);
}
// A shuffle of any word of up to 8 bytes: `source(lane)` names the lane read, or -1 for itself.
template <typename T, typename Source>
T shuffle(T value, Source source) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves a word of at most 8 bytes");
  uint64_t word = 0;
  std::memcpy(&word, &value, sizeof(T));
  word = warp_exchange(word, source(lane_of_this_thread()));
  T out;
  std::memcpy(&out, &word, sizeof(T));
  return out;
}

// atomicAdd & co. are relaxed read-modify-writes of device scope on CUDA: for late stores, an
// atomic write that publishes what the thread's fences released, and a relaxed read that a later
// fence turns into an acquire (late_stores.hpp).
template <typename T, typename Op>
T relaxed_rmw(T* p, Op op) {
  ::pmoe::emu::atomic_write_at(p, /*releases=*/false);
  const T old = op(std::atomic_ref<T>(*p));
  ::pmoe::emu::atomic_read_at(p, /*acquires=*/false);
  return old;
}
template <typename T>
T atomic_rmw_add(T* p, T v) {
  return relaxed_rmw(p, [&](std::atomic_ref<T> a) { return a.fetch_add(v, std::memory_order_acq_rel); });
}
template <typename T>
T atomic_rmw_cas(T* p, T compare, T value) {
  return relaxed_rmw(p, [&](std::atomic_ref<T> a) {
    a.compare_exchange_strong(compare, value, std::memory_order_acq_rel);
    return compare;
  });
}

}  // namespace pmoe::emu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __shared__ static thread_local
#define __launch_bounds__(...)

#define threadIdx (::pmoe::emu::this_thread().thread_idx)
#define blockIdx (::pmoe::emu::this_thread().block_idx)
#define blockDim (::pmoe::emu::this_thread().block_dim)
#define gridDim (::pmoe::emu::this_thread().grid_dim)
inline constexpr int warpSize = 32;

inline void __syncthreads() { ::pmoe::emu::sync_threads(); }
inline int __syncthreads_count(int predicate) { return ::pmoe::emu::sync_threads_count(predicate); }
inline int __syncthreads_or(int predicate) { return ::pmoe::emu::sync_threads_count(predicate) > 0; }
inline void __nanosleep(unsigned) { ::pmoe::emu::yield_thread(); }

// Warp shuffles. Every live lane of the warp takes part (pmoe's kernels pass the full mask), and
// `width` splits the warp into segments of that many lanes, as on a GPU.
template <typename T>
T __shfl_sync(unsigned, T var, int source, int width = 32) {
  return ::pmoe::emu::shuffle(var, [&](int lane) { return lane / width * width + source % width; });
}
template <typename T>
T __shfl_up_sync(unsigned, T var, unsigned delta, int width = 32) {
  return ::pmoe::emu::shuffle(var, [&](int lane) {
    return lane % width >= int(delta) ? lane - int(delta) : -1;
  });
}
template <typename T>
T __shfl_down_sync(unsigned, T var, unsigned delta, int width = 32) {
  return ::pmoe::emu::shuffle(var, [&](int lane) {
    return lane % width + int(delta) < width ? lane + int(delta) : -1;
  });
}
template <typename T>
T __shfl_xor_sync(unsigned, T var, int lane_mask, int width = 32) {
  return ::pmoe::emu::shuffle(var, [&](int lane) {
    const int other = lane ^ lane_mask;
    return other / width == lane / width ? other : -1;
  });
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  ::pmoe::emu::shuffle(0, [](int) { return -1; });
}

inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence() {
  ::pmoe::emu::fence_of_device_scope();
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
inline void __threadfence_system() {
  ::pmoe::emu::count_system_fence();
  ::pmoe::emu::fence_of_device_scope();
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

inline int atomicAdd(int* p, int v) { return ::pmoe::emu::atomic_rmw_add(p, v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return ::pmoe::emu::atomic_rmw_add(p, v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return ::pmoe::emu::atomic_rmw_add(p, v);
}
inline float atomicAdd(float* p, float v) { return ::pmoe::emu::atomic_rmw_add(p, v); }
inline int atomicSub(int* p, int v) { return ::pmoe::emu::atomic_rmw_add(p, -v); }
inline int atomicCAS(int* p, int compare, int value) {
  return ::pmoe::emu::atomic_rmw_cas(p, compare, value);
}
inline unsigned atomicCAS(unsigned* p, unsigned compare, unsigned value) {
  return ::pmoe::emu::atomic_rmw_cas(p, compare, value);
}
inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long compare,
                                    unsigned long long value) {
  return ::pmoe::emu::atomic_rmw_cas(p, compare, value);
}
inline int atomicExch(int* p, int v) {
  return ::pmoe::emu::relaxed_rmw(
      p, [&](std::atomic_ref<int> a) { return a.exchange(v, std::memory_order_acq_rel); });
}
inline int atomicMax(int* p, int v) {
  return ::pmoe::emu::relaxed_rmw(p, [&](std::atomic_ref<int> a) {
    int old = a.load(std::memory_order_relaxed);
    while (old < v && !a.compare_exchange_weak(old, v, std::memory_order_acq_rel)) {
    }
    return old;
  });
}
inline int atomicMin(int* p, int v) {
  return ::pmoe::emu::relaxed_rmw(p, [&](std::atomic_ref<int> a) {
    int old = a.load(std::memory_order_relaxed);
    while (old > v && !a.compare_exchange_weak(old, v, std::memory_order_acq_rel)) {
    }
    return old;
  });
}

// Arithmetic with the rounding named (no contraction into an FMA: pmoe builds with
// -ffp-contract=off, and each is a separate function anyway).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
