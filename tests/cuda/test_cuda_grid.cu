// The device's block scheduling, which pmoe's kernels rely on: one device, two host threads each
// with its own stream (two "ranks"). A kernel whose spinning blocks fill every resident slot
// starves the peer kernel it waits for, and pmoe's bounded wait names the peer; the same wait in
// one block lets the peer run; a peer that never launches, or whose kernel the scheduler holds
// back, ends the wait in a timeout that names it, never a hang. Built for the emulated device and
// for a GPU, like the other CUDA tests (tests/cuda/cuda_test_flavor.hpp); its kernels are the
// reason it is a .cu file.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <chrono>
#include <thread>

#include "cuda/all_to_all/device_utils.cuh"
#include "cuda/cuda_test_flavor.hpp"
#include "cuda/sm_count.hpp"

namespace pmoe::testing {
namespace {

using cuda::ErrorWord;

// Every block counts itself in, then waits for the peer's flag with pmoe's bounded wait.
__global__ void wait_for_peer(uint64_t* flag, uint32_t* started, ErrorWord* error,
                              uint64_t timeout_ns) {
  if (threadIdx.x == 0) {
    ::cuda::atomic_ref<uint32_t, ::cuda::thread_scope_system>(*started).fetch_add(
        1, ::cuda::memory_order_relaxed);
    cuda::wait_signal(flag, 1, timeout_ns, error, /*peer=*/1, cuda::Step::dispatch_recv);
  }
}

__global__ void raise_flag(uint64_t* flag) {
  if (threadIdx.x == 0) cuda::signal_release(flag, 1);
}

void expect_ok(cudaError_t status, const char* what) {
  ASSERT_EQ(status, cudaSuccess) << what << ": " << cudaGetErrorString(status);
}

struct Outcome {
  ErrorWord error;      // the waiting kernel's report (code kOk if the flag came in time)
  double waited_s = 0;  // how long the waiting kernel ran
};

// "Rank 0" launches `blocks` waiting blocks and, once they are all running, "rank 1" launches
// the kernel that raises the flag, on another stream of the same device (unless `peer_launches`
// is false: a peer that never arrives).
Outcome run_waiters(int blocks, double timeout_s, bool peer_launches = true) {
  Outcome out{};
  cudaStream_t waiter_stream = nullptr, peer_stream = nullptr;
  uint64_t* flag = nullptr;
  ErrorWord* error = nullptr;
  ErrorWord* mirror = nullptr;
  uint32_t* started = nullptr;
  expect_ok(cudaStreamCreateWithFlags(&waiter_stream, cudaStreamNonBlocking), "stream");
  expect_ok(cudaStreamCreateWithFlags(&peer_stream, cudaStreamNonBlocking), "stream");
  expect_ok(cudaMalloc(&flag, sizeof *flag), "cudaMalloc");
  expect_ok(cudaMalloc(&error, sizeof *error), "cudaMalloc");
  expect_ok(cudaHostAlloc(&mirror, sizeof *mirror, cudaHostAllocMapped), "cudaHostAlloc");
  expect_ok(cudaHostAlloc(&started, sizeof *started, cudaHostAllocMapped), "cudaHostAlloc");
  std::memset(mirror, 0, sizeof *mirror);
  *started = 0;
  ErrorWord initial{};
  initial.host_mirror = mirror;
  expect_ok(cudaMemcpy(error, &initial, sizeof initial, cudaMemcpyHostToDevice), "copy");
  expect_ok(cudaMemset(flag, 0, sizeof *flag), "memset");
  expect_ok(cudaDeviceSynchronize(), "sync");

  const auto t0 = std::chrono::steady_clock::now();
  cuda::launch_shaped(wait_for_peer, blocks, 32, waiter_stream, flag, started, error,
                      uint64_t(timeout_s * 1e9));
  // Rank 1 starts once rank 0's blocks hold their slots (or after 10 s, if they never all do).
  std::thread peer([&] {
    std::atomic_ref<uint32_t> count(*started);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (count.load() < uint32_t(blocks) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (peer_launches) cuda::launch_shaped(raise_flag, 1, 32, peer_stream, flag);
  });
  expect_ok(cudaStreamSynchronize(waiter_stream), "waiter");
  out.waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  peer.join();
  expect_ok(cudaStreamSynchronize(peer_stream), "peer");
  std::memcpy(&out.error, mirror, sizeof out.error);

  cudaFree(flag);
  cudaFree(error);
  cudaFreeHost(mirror);
  cudaFreeHost(started);
  cudaStreamDestroy(waiter_stream);
  cudaStreamDestroy(peer_stream);
  return out;
}

int resident_blocks() {
  int device = 0, per_sm = 0;
  cudaGetDevice(&device);
  const int sms = cuda::sm_count(device);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, wait_for_peer, 32, 0);
  return sms * per_sm;
}

TEST(DeviceGrid, SpinningBlocksThatFillTheDeviceStarveThePeerAndTheWaitNamesIt) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const Outcome out = run_waiters(resident_blocks(), 1.0);
  EXPECT_EQ(out.error.code, cuda::kTimeout);
  EXPECT_EQ(out.error.detail, 1) << "the wait names the peer it waited for";
  EXPECT_GE(out.waited_s, 1.0);
}

TEST(DeviceGrid, OneSpinningBlockLeavesRoomForThePeer) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const Outcome out = run_waiters(1, 30.0);
  EXPECT_EQ(out.error.code, cuda::kOk);
  EXPECT_LT(out.waited_s, 10.0);
}

// A peer that never launches its kernel: the wait ends in a timeout that names it, after the
// timeout and well before a hang, whatever the device and however many hardware queues it has
// (cuda.grid.one_hardware_queue runs this with one).
TEST(DeviceGrid, AWaitForAPeerThatNeverArrivesEndsInATimeoutNamingIt) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const Outcome out = run_waiters(1, 1.0, /*peer_launches=*/false);
  EXPECT_EQ(out.error.code, cuda::kTimeout);
  EXPECT_EQ(out.error.detail, 1) << "the wait names the peer it waited for";
  EXPECT_GE(out.waited_s, 1.0);
  EXPECT_LT(out.waited_s, 30.0) << "the bounded wait outlived its timeout";
}

// Streams that share a hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1, as ctest's
// cuda.grid.one_hardware_queue runs this): whether the peer's kernel, queued behind the spinning
// one on another stream, starts beside it is the driver's and the GPU's choice. CUDA says only
// that streams aliased onto one connection *may* wait for each other: the first lease's H100 held
// the peer back (the wait timed out), an H200 ran it (the flag came), and the emulated device
// runs such kernels in turn. pmoe never counts on either: AllToAll refuses more streams on a
// device than hardware queues, and a wait that nothing satisfies ends in a timeout. So this checks
// what pmoe relies on, on any device: the wait ends either way, within its bound, and a timeout
// names the peer. The outcome is recorded (the test's "outcome" property) and printed. With more
// queues than streams the peer's kernel runs beside the waiter, as pmoe's thread ranks need.
TEST(DeviceGrid, AWaitBehindAPeerOnASharedHardwareQueueEndsEitherWay) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const char* setting = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const bool one_queue = setting && std::string(setting) == "1";
  const double timeout_s = one_queue ? 1.0 : 30.0;
  const Outcome out = run_waiters(1, timeout_s);
  const bool ran = out.error.code == cuda::kOk;
  const char* outcome = ran ? "the peer's kernel ran beside the waiting one"
                            : "the peer's kernel waited behind the waiting one, which timed out";
  ::testing::Test::RecordProperty("outcome", outcome);
  std::printf("[ outcome  ] %s hardware queue%s: %s (%.2f s)\n", one_queue ? "one" : "several",
              one_queue ? "" : "s", outcome, out.waited_s);
  EXPECT_LT(out.waited_s, timeout_s + 10.0) << "the bounded wait outlived its timeout";
  if (one_queue && !ran) {
    EXPECT_EQ(out.error.code, cuda::kTimeout);
    EXPECT_EQ(out.error.detail, 1) << "the wait names the peer it waited for";
    EXPECT_GE(out.waited_s, timeout_s);
  } else {
    EXPECT_EQ(out.error.code, cuda::kOk) << "with a hardware queue per stream the peer must run";
  }
}

}  // namespace
}  // namespace pmoe::testing
