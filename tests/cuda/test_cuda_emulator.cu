// One device, one process: the emulated device's strictness on its own (src/cuda/emulator:
// schedule.hpp, late_stores.hpp). Under PMOE_EMU_SCHEDULE=thread0-last a value thread 0 writes to
// __shared__ is missed by every other thread when no __syncthreads() publishes it; under
// PMOE_EMU_LATE_STORES=1 data stored with store_to_peer and signalled by a relaxed store, or after
// a fence of block scope, or by another thread without a barrier, is still the old value when the
// signal arrives, and every correct way to publish it delivers it. The correct kernels are checked
// under every schedule and on a GPU; the wrong ones only where the emulated device promises to
// catch them (ctest runs this binary under both settings: tests/CMakeLists.txt). The same for a
// host that reads host-mapped memory a kernel is still writing: it sees the data before a flag
// stored with release, and may see a relaxed flag first (src/cuda/emulator/host_view.hpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda/all_to_all/device_utils.cuh"
#include "cuda/cuda_test_flavor.hpp"

namespace pmoe::testing {
namespace {

void expect_ok(cudaError_t status, const char* what) {
  ASSERT_EQ(status, cudaSuccess) << what << ": " << cudaGetErrorString(status);
}

bool env_is(const char* name, const char* value) {
  const char* text = std::getenv(name);
  return text && std::strcmp(text, value) == 0;
}
bool thread0_last() { return kOnEmulatedDevice && env_is("PMOE_EMU_SCHEDULE", "thread0-last"); }
bool late_stores() { return kOnEmulatedDevice && env_is("PMOE_EMU_LATE_STORES", "1"); }

// Thread 0 writes a value only this launch and block use; every thread records what it reads.
template <bool kBarrier>
__global__ void broadcast_from_thread0(int* seen, int salt) {
  __shared__ int value;
  if (threadIdx.x == 0) value = salt * 4096 + int(blockIdx.x);
  if (kBarrier) __syncthreads();
  seen[blockIdx.x * blockDim.x + threadIdx.x] = value;
}

// How many threads other than thread 0 read the value thread 0 wrote in their block.
template <bool kBarrier>
int readers_that_saw_thread0(int salt, int blocks, int threads) {
  int* seen = nullptr;
  const size_t n = size_t(blocks) * size_t(threads);
  expect_ok(cudaMalloc(&seen, n * sizeof(int)), "cudaMalloc");
  cuda::launch_shaped(broadcast_from_thread0<kBarrier>, unsigned(blocks), unsigned(threads),
                      nullptr, seen, salt);
  std::vector<int> host(n);
  expect_ok(cudaMemcpy(host.data(), seen, n * sizeof(int), cudaMemcpyDeviceToHost), "copy back");
  cudaFree(seen);
  int saw = 0;
  for (int b = 0; b < blocks; ++b)
    for (int t = 1; t < threads; ++t) saw += host[size_t(b * threads + t)] == salt * 4096 + b;
  return saw;
}

TEST(EmulatedDevice, BarrierPublishesThread0sSharedWriteUnderEverySchedule) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  for (int salt = 1; salt <= 3; ++salt)
    EXPECT_EQ(readers_that_saw_thread0<true>(salt, 6, 96), 6 * 95) << "launch " << salt;
}

TEST(EmulatedDevice, MissingBarrierAfterThread0sSharedWriteFailsWhenThread0RunsLast) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  for (int salt = 11; salt <= 13; ++salt) {
    const int saw = readers_that_saw_thread0<false>(salt, 6, 96);
    // Elsewhere it is a race whose outcome depends on the schedule (on a GPU, on the warps).
    if (thread0_last()) {
      EXPECT_EQ(saw, 0) << "launch " << salt << ": a reader ran after thread 0";
    }
  }
}

// Thread 0 of each block reads the block's __shared__ word before it writes it. Not a template:
// the emulated device garbage-fills only the `__shared__` of non-inline functions
// (src/cuda/emulator/shared_memory.hpp).
constexpr int kLeftByTheLastBlock = 0x5eed;
__global__ void read_shared_before_writing(int* first_read) {
  __shared__ int word;
  if (threadIdx.x == 0) {
    first_read[blockIdx.x] = word;
    word = kLeftByTheLastBlock;
  }
}

// On a GPU a block's shared memory holds what an earlier block left; a block that reads it
// before its own write (a missing barrier before thread 0's flag is read) must not find the
// right value there by luck. More blocks than the device holds at once, so host threads are
// reused.
TEST(EmulatedDevice, SharedMemoryStartsWithGarbageNotWhatTheBlockBeforeLeft) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  if (!kOnEmulatedDevice) GTEST_SKIP() << "a GPU leaves whatever it leaves";
  constexpr int kBlocks = 96;
  int* first_read = nullptr;
  expect_ok(cudaMalloc(&first_read, kBlocks * sizeof(int)), "cudaMalloc");
  for (int launch = 0; launch < 2; ++launch) {
    cuda::launch_shaped(read_shared_before_writing, unsigned(kBlocks), 32u, nullptr, first_read);
    std::vector<int> host(kBlocks);
    expect_ok(cudaMemcpy(host.data(), first_read, sizeof(int) * kBlocks, cudaMemcpyDeviceToHost),
              "copy back");
    for (int b = 0; b < kBlocks; ++b) {
      EXPECT_NE(host[size_t(b)], kLeftByTheLastBlock) << "launch " << launch << " block " << b;
      EXPECT_EQ(uint32_t(host[size_t(b)]), 0xcdcdcdcdu) << "launch " << launch << " block " << b;
    }
  }
  cudaFree(first_read);
}

// The ways block 0 publishes a word to block 1 of the same grid.
enum class Publish {
  release_store,              // right: the signal's release store
  fence_then_relaxed,         // right: __threadfence(), then a relaxed store
  other_thread_with_barrier,  // right: thread 5 stores; barrier; thread 0 fences and signals
  relaxed_only,               // wrong: nothing orders the data before the signal
  block_fence_then_relaxed,   // wrong: a fence of block scope does not order it for block 1
  other_thread_no_barrier,    // wrong: thread 0's fence does not cover thread 5's store
};

// The signal's order after a fence: relaxed (fence then relaxed store is a release on CUDA). Under
// ThreadSanitizer, which does not model fences, a release store, which orders the same stores.
#if defined(__SANITIZE_THREAD__)
constexpr ::cuda::memory_order kSignalAfterFence = ::cuda::memory_order_release;
#else
constexpr ::cuda::memory_order kSignalAfterFence = ::cuda::memory_order_relaxed;
#endif

// The ways block 1 waits for the signal before it reads the word.
enum class Observe {
  acquire,                   // right: the signal read with acquire (signal_acquire)
  relaxed_then_fence,        // right: relaxed reads, then __threadfence() (an acquire, PTX)
  relaxed_only,              // wrong: nothing orders the read of the word after the signal's
  relaxed_then_block_fence,  // wrong: a fence of block scope does not acquire from block 0
};

__global__ void publish_to_other_block(Publish how, int* data, uint64_t* flag, int* seen,
                                       int value, Observe observe = Observe::acquire) {
  using Flag = ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>;
  if (blockIdx.x == 0) {
    const bool other = how == Publish::other_thread_with_barrier ||
                       how == Publish::other_thread_no_barrier;
    if (int(threadIdx.x) == (other ? 5 : 0)) cuda::store_to_peer(data, value);
    if (how == Publish::other_thread_with_barrier) __syncthreads();
    if (threadIdx.x != 0) return;
    switch (how) {
      case Publish::release_store: cuda::signal_release(flag, 1); return;
      case Publish::relaxed_only: break;
      case Publish::block_fence_then_relaxed: __threadfence_block(); break;
      default:
        __threadfence();
        Flag(*flag).store(1, kSignalAfterFence);
        return;
    }
    Flag(*flag).store(1, ::cuda::memory_order_relaxed);
  } else if (threadIdx.x == 0) {
    using Flag = ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>;
    auto signalled = [&] {
      return observe == Observe::acquire ? cuda::signal_acquire(flag) >= 1
                                         : Flag(*flag).load(::cuda::memory_order_relaxed) >= 1;
    };
    const uint64_t start = cuda::global_timer_ns();
    while (!signalled()) {
      if (cuda::global_timer_ns() - start > uint64_t(20e9)) {
        *seen = -2;  // the signal never came
        return;
      }
      __nanosleep(100);
    }
    if (observe == Observe::relaxed_then_fence) __threadfence();
    if (observe == Observe::relaxed_then_block_fence) __threadfence_block();
    *seen = *reinterpret_cast<volatile int*>(data);
  }
}

struct Published {
  int seen;   // what block 1 read once the signal arrived
  int after;  // what the word holds after the kernel
};

Published publish(Publish how, int value, Observe observe = Observe::acquire) {
  int *data = nullptr, *seen = nullptr;
  uint64_t* flag = nullptr;
  expect_ok(cudaMalloc(&data, sizeof *data), "cudaMalloc");
  expect_ok(cudaMalloc(&seen, sizeof *seen), "cudaMalloc");
  expect_ok(cudaMalloc(&flag, sizeof *flag), "cudaMalloc");
  expect_ok(cudaMemset(data, 0, sizeof *data), "memset");
  expect_ok(cudaMemset(seen, 0xff, sizeof *seen), "memset");
  expect_ok(cudaMemset(flag, 0, sizeof *flag), "memset");
  cuda::launch_shaped(publish_to_other_block, 2, 32, nullptr, how, data, flag, seen, value,
                      observe);
  Published out{};
  expect_ok(cudaMemcpy(&out.seen, seen, sizeof out.seen, cudaMemcpyDeviceToHost), "copy back");
  expect_ok(cudaMemcpy(&out.after, data, sizeof out.after, cudaMemcpyDeviceToHost), "copy back");
  cudaFree(data);
  cudaFree(seen);
  cudaFree(flag);
  return out;
}

TEST(EmulatedDevice, DataPublishedWithAFenceOrReleaseOfDeviceScopeArrivesBeforeItsSignal) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  int value = 100;
  for (Publish how : {Publish::release_store, Publish::fence_then_relaxed,
                      Publish::other_thread_with_barrier}) {
    const Published out = publish(how, ++value);
    EXPECT_EQ(out.seen, value) << "publish way " << int(how);
    EXPECT_EQ(out.after, value) << "publish way " << int(how);
  }
}

TEST(EmulatedDevice, LateStoresMakeARelaxedOrNarrowSignalArriveBeforeItsData) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  // Elsewhere these kernels race (x86 would hide it): only late stores promise an outcome.
  if (!late_stores()) GTEST_SKIP() << "needs PMOE_EMU_LATE_STORES=1 (as ctest runs it)";
  int value = 200;
  for (Publish how : {Publish::relaxed_only, Publish::block_fence_then_relaxed,
                      Publish::other_thread_no_barrier}) {
    const Published out = publish(how, ++value);
    EXPECT_EQ(out.seen, 0) << "publish way " << int(how) << ": the data came with its signal";
    EXPECT_EQ(out.after, value) << "publish way " << int(how) << ": the kernel's end releases it";
  }
}

TEST(EmulatedDevice, ReaderThatAcquiresOrFencesAfterItsRelaxedReadSeesTheData) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  int value = 300;
  for (Observe observe : {Observe::acquire, Observe::relaxed_then_fence}) {
    for (Publish how : {Publish::release_store, Publish::fence_then_relaxed}) {
      const Published out = publish(how, ++value, observe);
      EXPECT_EQ(out.seen, value) << "observe way " << int(observe) << ", publish way " << int(how);
    }
  }
}

TEST(EmulatedDevice, LateStoresHideReleasedDataFromAReaderThatDoesNotAcquire) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  // Elsewhere these kernels race (x86 would hide it): only late stores promise an outcome.
  if (!late_stores()) GTEST_SKIP() << "needs PMOE_EMU_LATE_STORES=1 (as ctest runs it)";
  int value = 400;
  for (Observe observe : {Observe::relaxed_only, Observe::relaxed_then_block_fence}) {
    for (Publish how : {Publish::release_store, Publish::fence_then_relaxed}) {
      const Published out = publish(how, ++value, observe);
      EXPECT_EQ(out.seen, 0) << "observe way " << int(observe) << ", publish way " << int(how)
                             << ": the data came without an acquire";
      EXPECT_EQ(out.after, value) << "the kernel's end delivers it";
    }
  }
}

// A kernel thread publishes a word of host-mapped memory to the host: the data (stored with
// store_to_peer, or atomically and relaxed), then a flag in the same memory. The thread then
// waits for the host's ack, so its kernel's end cannot deliver the data before the host reads it.
enum class HostData { plain, relaxed_atomic };
enum class HostSignal { relaxed, release, fence_then_relaxed };

__global__ void publish_to_host(HostData data_kind, HostSignal signal, int* words, int value) {
  using Word = ::cuda::atomic_ref<int, ::cuda::thread_scope_system>;
  int &data = words[0], &flag = words[1], &ack = words[2];
  if (data_kind == HostData::plain)
    cuda::store_to_peer(&data, value);
  else
    Word(data).store(value, ::cuda::memory_order_relaxed);
  if (signal == HostSignal::fence_then_relaxed) __threadfence_system();
  Word(flag).store(1, signal == HostSignal::release ? ::cuda::memory_order_release
                      : signal == HostSignal::relaxed ? ::cuda::memory_order_relaxed
                                                      : kSignalAfterFence);
  const uint64_t start = cuda::global_timer_ns();
  while (Word(ack).load(::cuda::memory_order_acquire) == 0 &&
         cuda::global_timer_ns() - start < uint64_t(20e9))
    __nanosleep(1000);
}

struct SeenByHost {
  int flag;   // the flag the host waited for (0: it never came)
  int seen;   // the data the host read once the flag came (acquired; the data read relaxed)
  int after;  // the data after a host synchronisation
};

SeenByHost publish_to_host(HostData data_kind, HostSignal signal, int value) {
  using Word = ::cuda::atomic_ref<int, ::cuda::thread_scope_system>;
  int *words = nullptr, *device_words = nullptr;
  expect_ok(cudaHostAlloc(reinterpret_cast<void**>(&words), 3 * sizeof(int), cudaHostAllocMapped),
            "cudaHostAlloc");
  std::memset(words, 0, 3 * sizeof(int));
  expect_ok(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_words), words, 0),
            "cudaHostGetDevicePointer");
  cuda::launch_shaped(publish_to_host, 1u, 1u, nullptr, data_kind, signal, device_words, value);
  SeenByHost out{};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((out.flag = Word(words[1]).load(::cuda::memory_order_acquire)) == 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  out.seen = Word(words[0]).load(::cuda::memory_order_relaxed);
  Word(words[2]).store(1, ::cuda::memory_order_release);
  expect_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  out.after = Word(words[0]).load(::cuda::memory_order_relaxed);
  cudaFreeHost(words);
  return out;
}

TEST(EmulatedDevice, HostThatAcquiresAReleasedFlagInHostMappedMemorySeesTheDataBeforeIt) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  int value = 500;
  for (HostData data : {HostData::plain, HostData::relaxed_atomic}) {
    for (HostSignal signal : {HostSignal::release, HostSignal::fence_then_relaxed}) {
      const SeenByHost out = publish_to_host(data, signal, ++value);
      EXPECT_EQ(out.flag, 1) << "data " << int(data) << ", signal " << int(signal);
      EXPECT_EQ(out.seen, value) << "data " << int(data) << ", signal " << int(signal);
      EXPECT_EQ(out.after, value) << "data " << int(data) << ", signal " << int(signal);
    }
  }
}

TEST(EmulatedDevice, LateStoresShowTheHostARelaxedFlagInHostMappedMemoryBeforeItsData) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  // Elsewhere the host may see either value (x86 would show the data): only late stores promise.
  if (!late_stores()) GTEST_SKIP() << "needs PMOE_EMU_LATE_STORES=1 (as ctest runs it)";
  int value = 600;
  for (HostData data : {HostData::plain, HostData::relaxed_atomic}) {
    const SeenByHost out = publish_to_host(data, HostSignal::relaxed, ++value);
    EXPECT_EQ(out.flag, 1) << "data " << int(data);
    EXPECT_EQ(out.seen, 0) << "data " << int(data) << ": the data came with its relaxed flag";
    EXPECT_EQ(out.after, value) << "data " << int(data) << ": a host synchronisation shows it";
  }
}

// Every block stores its word for the last one; cuda::last_block promises that block sees every
// earlier write of every block (after a barrier, thread 0 alone fences for the block, then counts
// in with a relaxed atomicAdd; the last one fences after its own count: the acquire). The word
// is stored by thread 1, so only the barrier makes thread 0's fence cover it. More blocks than
// the device holds at once.
__global__ void sum_in_the_last_block(int* words, uint32_t* counter, int* sum) {
  if (threadIdx.x == 1) cuda::store_to_peer(words + blockIdx.x, int(blockIdx.x) + 1);
  if (!cuda::last_block(counter, /*device_scope=*/true)) return;
  int total = 0;
  for (unsigned b = 0; b < gridDim.x; ++b) total += *reinterpret_cast<volatile int*>(words + b);
  *sum = total;
}

TEST(EmulatedDevice, LastBlockSeesEveryBlocksWrites) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  constexpr int kBlocks = 40;
  int *words = nullptr, *sum = nullptr;
  uint32_t* counter = nullptr;
  expect_ok(cudaMalloc(&words, kBlocks * sizeof(int)), "cudaMalloc");
  expect_ok(cudaMalloc(&sum, sizeof(int)), "cudaMalloc");
  expect_ok(cudaMalloc(&counter, sizeof(uint32_t)), "cudaMalloc");
  expect_ok(cudaMemset(counter, 0, sizeof(uint32_t)), "memset");
  for (int launch = 0; launch < 3; ++launch) {
    expect_ok(cudaMemset(words, 0, kBlocks * sizeof(int)), "memset");
    expect_ok(cudaMemset(sum, 0xff, sizeof(int)), "memset");
    cuda::launch_shaped(sum_in_the_last_block, unsigned(kBlocks), 64u, nullptr, words, counter, sum);
    int host = 0;
    expect_ok(cudaMemcpy(&host, sum, sizeof host, cudaMemcpyDeviceToHost), "copy back");
    EXPECT_EQ(host, kBlocks * (kBlocks + 1) / 2) << "launch " << launch;
  }
  cudaFree(words);
  cudaFree(sum);
  cudaFree(counter);
}

// Each thread's inclusive scan within its warp by __shfl_up_sync, its warp's sum by
// __shfl_xor_sync, lane 0's value by __shfl_sync and its right neighbour's by __shfl_down_sync;
// then the block-wide exclusive sum of AllToAll's kernels (one barrier).
__global__ void shuffle_everything(const int* in, int* scan, int* warp_sum, int* from_lane0,
                                   int* from_next, int* exclusive, int* total) {
  const int t = threadIdx.x, lane = t % 32;
  const int v = in[t];
  int inclusive = v;
  for (int step = 1; step < 32; step *= 2) {
    const int before = __shfl_up_sync(0xffffffffu, inclusive, step);
    if (lane >= step) inclusive += before;
  }
  scan[t] = inclusive;
  int sum = v;
  for (int mask = 16; mask > 0; mask /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, mask);
  warp_sum[t] = sum;
  from_lane0[t] = __shfl_sync(0xffffffffu, v, 0);
  from_next[t] = __shfl_down_sync(0xffffffffu, v, 1);
  int all = 0;
  exclusive[t] = cuda::block_exclusive_sum(v, all);
  if (t == 0) *total = all;
}

TEST(EmulatedDevice, WarpShufflesAndTheBlockScanMatchTheHost) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  constexpr int kThreads = cuda::kBlockThreads;
  std::vector<int> in(kThreads);
  for (int t = 0; t < kThreads; ++t) in[t] = (t * 37 + 11) % 23 - 7;
  int* device = nullptr;  // in, then six outputs of kThreads words each
  expect_ok(cudaMalloc(&device, 7 * kThreads * sizeof(int)), "cudaMalloc");
  expect_ok(cudaMemcpy(device, in.data(), kThreads * sizeof(int), cudaMemcpyHostToDevice),
            "copy in");
  int* out = device + kThreads;
  cuda::launch_shaped(shuffle_everything, 1u, unsigned(kThreads), nullptr,
                      static_cast<const int*>(device), out, out + kThreads, out + 2 * kThreads,
                      out + 3 * kThreads, out + 4 * kThreads, out + 5 * kThreads);
  std::vector<int> got(6 * kThreads);
  expect_ok(cudaMemcpy(got.data(), out, got.size() * sizeof(int), cudaMemcpyDeviceToHost),
            "copy back");
  int running = 0, block_total = 0;
  for (int t = 0; t < kThreads; ++t) block_total += in[t];
  for (int t = 0; t < kThreads; ++t) {
    const int first = t / 32 * 32;
    int inclusive = 0, warp = 0;
    for (int i = first; i <= t; ++i) inclusive += in[i];
    for (int i = first; i < first + 32; ++i) warp += in[i];
    EXPECT_EQ(got[t], inclusive) << "scan, thread " << t;
    EXPECT_EQ(got[kThreads + t], warp) << "warp sum, thread " << t;
    EXPECT_EQ(got[2 * kThreads + t], in[first]) << "lane 0's value, thread " << t;
    EXPECT_EQ(got[3 * kThreads + t], t % 32 == 31 ? in[t] : in[t + 1]) << "next, thread " << t;
    EXPECT_EQ(got[4 * kThreads + t], running) << "block exclusive sum, thread " << t;
    running += in[t];
  }
  EXPECT_EQ(got[5 * kThreads], block_total);
  cudaFree(device);
}

}  // namespace
}  // namespace pmoe::testing
