// Device-side building blocks of AllToAll's kernels: epoch signals with system-scope release and
// acquire, bounded waits that report through the error word, block copies in the widest aligned
// words, last-block election. Every store here that another block, kernel or rank reads goes
// through store_to_peer (src/cuda/memory_ops.cuh): visible to them once the storing thread
// releases it (a fence or release store of device/system scope, e.g. signal_release) or the
// kernel ends; the emulated device holds it back until then (PMOE_EMU_LATE_STORES=1).
#pragma once

#include "cuda/all_to_all/params.cuh"  // first: see there

#include <cuda/atomic>

#include "cuda/launch.cuh"
#include "cuda/memory_ops.cuh"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

// Epoch signals. A peer that shares this GPU needs only device scope (fence.gpu, ld/st .gpu);
// one on another GPU (CUDA IPC) needs system scope, which costs a round trip to the fabric.
__device__ __forceinline__ void signal_release(uint64_t* word, uint64_t value,
                                               bool device_scope = false) {
  if (device_scope)
    ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_device>(*word).store(
        value, ::cuda::memory_order_release);
  else
    ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(*word).store(
        value, ::cuda::memory_order_release);
}

__device__ __forceinline__ uint64_t signal_acquire(uint64_t* word, bool device_scope = false) {
  if (device_scope)
    return ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_device>(*word).load(
        ::cuda::memory_order_acquire);
  return ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(*word).load(
      ::cuda::memory_order_acquire);
}

// A fence that publishes the block's stores (cumulative over those made before a barrier the
// calling thread passed) to peers: of device scope where every peer shares this GPU.
__device__ __forceinline__ void fence_for_peers(bool device_scope) {
  if (device_scope)
    __threadfence();
  else
    __threadfence_system();
}

// Records the first error of this op; later ones are dropped. The race is decided in device
// memory (atomics on host-mapped memory are not atomic over PCIe); the winner then copies the
// word to its host-mapped mirror, which the host reads without synchronizing.
__device__ __forceinline__ void report(ErrorWord* error, int32_t code, int32_t detail, Step step,
                                      int32_t value = 0, uint64_t call = 0) {
  if (atomicCAS(&error->code, kOk, code) == kOk) {
    error->detail = detail;
    error->step = int32_t(step);
    error->value = value;
    error->call = call;
    using HostWord = ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_system>;
    ErrorWord* mirror = error->host_mirror;
    HostWord(mirror->detail).store(detail, ::cuda::memory_order_relaxed);
    HostWord(mirror->step).store(int32_t(step), ::cuda::memory_order_relaxed);
    HostWord(mirror->value).store(value, ::cuda::memory_order_relaxed);
    ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(mirror->call)
        .store(call, ::cuda::memory_order_relaxed);
    __threadfence_system();
    // Last: the host reads the code first.
    HostWord(mirror->code).store(code, ::cuda::memory_order_release);
    __threadfence_system();
  }
}

// Spins until read() >= value; false (and an error report naming `peer`, with `awaited` for the
// host's message: a TimeoutWait) after the timeout, once another thread reported a fatal error,
// or once the host set the abort word (on_peer_loss = mask). read() is a signal read with
// acquire; `value` is the epoch awaited, the call the report names.
template <typename Read>
__device__ __forceinline__ bool wait_until_at_least(Read read, uint64_t value, uint64_t timeout_ns,
                                                   ErrorWord* error, int peer, Step step,
                                                   int32_t awaited = kAwaitedData) {
  const uint64_t start = global_timer_ns();
  for (uint32_t polls = 0; read() < value; ++polls) {
    if (global_timer_ns() - start > timeout_ns) {
      report(error, kTimeout, peer, step, awaited, value);
      return false;
    }
    const int32_t code = ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device>(error->code)
                             .load(::cuda::memory_order_relaxed);
    if (is_fatal(code)) return false;
    // The abort word lies across the host link: read it once in 32 polls.
    if (polls % 32 == 31 && error->abort &&
        ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_system>(*error->abort)
            .load(::cuda::memory_order_relaxed)) {
      report(error, kAborted, peer, step, awaited, value);
      return false;
    }
    __nanosleep(100);
  }
  return true;
}

// Spins until `word` >= value, as wait_until_at_least says (a signal of system scope: the
// writer may be on another GPU).
__device__ __forceinline__ bool wait_signal(uint64_t* word, uint64_t value, uint64_t timeout_ns,
                                           ErrorWord* error, int peer, Step step) {
  return wait_until_at_least([word] { return signal_acquire(word); }, value, timeout_ns, error,
                             peer, step);
}

template <typename Word>
__device__ __forceinline__ void copy_words(std::byte* dst, const std::byte* src, size_t words) {
  auto* d = reinterpret_cast<Word*>(dst);
  const auto* s = reinterpret_cast<const Word*>(src);
  for (size_t i = threadIdx.x; i < words; i += blockDim.x) {
    count_serial_steps(1);
    store_to_peer(d + i, load_global(s + i));
  }
}

// Copies `bytes` with the calling block's threads, in the widest words (16, 8, 4, 2 or 1 bytes)
// on which dst and src agree modulo the word: a byte-wise head up to dst's first aligned word,
// then whole words, then a byte-wise tail shorter than one word.
__device__ __forceinline__ void block_copy(std::byte* dst, const std::byte* src, size_t bytes) {
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  const uintptr_t skew = (d ^ s) | 16;
  const size_t word = skew & (~skew + 1);  // the lowest bit in which they differ, at most 16
  const size_t to_aligned = (word - d % word) % word;
  const size_t head = to_aligned < bytes ? to_aligned : bytes;
  const size_t words = (bytes - head) / word, tail = head + words * word;
  switch (word) {
    case 16: copy_words<int4>(dst + head, src + head, words); break;
    case 8: copy_words<int2>(dst + head, src + head, words); break;
    case 4: copy_words<int32_t>(dst + head, src + head, words); break;
    case 2: copy_words<int16_t>(dst + head, src + head, words); break;
    default: copy_words<std::byte>(dst + head, src + head, words);
  }
  for (size_t i = threadIdx.x; i < head; i += blockDim.x) store_to_peer(dst + i, load_global(src + i));
  for (size_t i = tail + threadIdx.x; i < bytes; i += blockDim.x)
    store_to_peer(dst + i, load_global(src + i));
}

// Copies `bytes` from src to dest(i) for each i < n with include(i), with the calling block's
// threads. Where src and every destination are 16-byte aligned, each thread keeps kCopyUnroll
// 16-byte loads in flight and stores each loaded word to every destination, so src is read
// once however many destinations there are; src must not change while the kernel runs (it is
// read with load_streaming). Otherwise, block_copy to each destination.
constexpr int kCopyUnroll = 4;
template <typename Include, typename Dest>
__device__ __forceinline__ void copy_to_each(int n, Include include, Dest dest,
                                             const std::byte* src, size_t bytes) {
  bool aligned = reinterpret_cast<uintptr_t>(src) % 16 == 0, any = false;
  for (int i = 0; i < n; ++i)
    if (include(i)) {
      any = true;
      aligned = aligned && reinterpret_cast<uintptr_t>(dest(i)) % 16 == 0;
    }
  if (!any) return;  // nothing to read it for (a token every destination reads in place)
  if (!aligned) {
    for (int i = 0; i < n; ++i)
      if (include(i)) block_copy(dest(i), src, bytes);
    return;
  }
  const size_t words = bytes / 16, stride = size_t(blockDim.x) * kCopyUnroll;
  const auto* from = reinterpret_cast<const int4*>(src);
  for (size_t base = threadIdx.x; base < words; base += stride) {
    int4 v[kCopyUnroll];
    for (int u = 0; u < kCopyUnroll; ++u) {
      const size_t w = base + size_t(u) * blockDim.x;
      if (w < words) v[u] = load_streaming(from + w);
    }
    for (int i = 0; i < n; ++i) {
      if (!include(i)) continue;
      count_serial_steps(kCopyUnroll);
      auto* to = reinterpret_cast<int4*>(dest(i));
      for (int u = 0; u < kCopyUnroll; ++u) {
        const size_t w = base + size_t(u) * blockDim.x;
        if (w < words) store_to_peer(to + w, v[u]);
      }
    }
  }
  for (size_t b = words * 16 + threadIdx.x; b < bytes; b += blockDim.x) {  // a tail under 16 B
    const std::byte value = load_global(src + b);
    for (int i = 0; i < n; ++i)
      if (include(i)) store_to_peer(dest(i) + b, value);
  }
}

// The sum of `value` over the block's threads before the calling one; `total` gets the sum over
// all of them. Each warp scans its 32 values with shuffles (5 steps, no barrier), lane 31 posts
// the warp's sum, and after one barrier each thread adds the sums of the warps before its own
// (at most 7). A collective of the block; once per kernel (a second call would overwrite the
// warp sums the first one's last reads come from).
__device__ __forceinline__ int block_exclusive_sum(int value, int& total) {
  constexpr int kWarps = kBlockThreads / 32;
  __shared__ int warp_sums[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int inclusive = value;
  PMOE_UNROLL
  for (int step = 1; step < 32; step *= 2) {
    const int before = __shfl_up_sync(0xffffffffu, inclusive, step);
    if (lane >= step) inclusive += before;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  int earlier = 0;
  total = 0;
  for (int w = 0; w < int(blockDim.x) / 32; ++w) {
    count_serial_steps(1);
    if (w < warp) earlier += warp_sums[w];
    total += warp_sums[w];
  }
  return earlier + inclusive - value;
}

using ::pmoe::detail::first_in_group;  // src/all_to_all/route.hpp, the CPU backend's rule too

// True in exactly one thread of the last block of the grid to get here; every earlier write of
// every block is visible to it. Resets the counter for the next launch. `device_scope`: every
// reader of the blocks' writes (peers included) is on this GPU.
__device__ __forceinline__ bool last_block_all(uint32_t* counter, bool device_scope);
__device__ __forceinline__ bool last_block(uint32_t* counter, bool device_scope) {
  return last_block_all(counter, device_scope) && threadIdx.x == 0;
}

// The same in every thread of that block (a collective of the block: all its threads call it).
// One fence per block: thread 0's, after the barrier, is cumulative over every thread's writes
// before it, and with the relaxed ticket after it makes a release.
__device__ __forceinline__ bool last_block_all(uint32_t* counter, bool device_scope) {
  __shared__ bool is_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_for_peers(device_scope);
    is_last = atomicAdd(counter, 1u) == gridDim.x - 1;
    if (is_last) {
      *counter = 0;
      __threadfence();  // the other blocks' writes (fenced before they counted) come first
    }
  }
  __syncthreads();
  return is_last;
}

// True if an earlier kernel of this rank recorded a fatal error: the kernels of later steps then
// do nothing. Read at a kernel's start, where stream order makes every block see the same value.
__device__ __forceinline__ bool failed_before(const AllToAllParams& p) {
  return is_fatal(::cuda::atomic_ref<int32_t, ::cuda::thread_scope_device>(p.error->code)
                      .load(::cuda::memory_order_relaxed));
}

// True if the device expects `step` next; otherwise reports kStepOrder (fatal). Call from one
// thread; the caller advances p.round->next_step once the step's work is done.
__device__ __forceinline__ bool step_in_order(const AllToAllParams& p, Step step) {
  const int32_t expected = p.round->next_step;
  if (expected == int32_t(step)) return true;
  report(p.error, kStepOrder, expected, step);
  return false;
}

// m for this call: bound_m when given (read on the device, so graph replays can change it),
// clamped to [0, rows given]; route_tokens reports a bound_m outside that range.
__device__ __forceinline__ int requested_tokens(const AllToAllParams& p) {
  return p.bound_m ? *p.bound_m : p.m;
}
__device__ __forceinline__ int tokens_this_call(const AllToAllParams& p) {
  return max(0, min(requested_tokens(p), p.m));
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
