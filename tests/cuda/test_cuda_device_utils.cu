// The device-side building blocks of AllToAll's kernels (src/cuda/all_to_all/device_utils.cuh)
// on their own: block_copy at every pairing of source and destination misalignment and at sizes
// around each access width, and copy_to_each to up to 3 destinations (some left out) at sizes
// around its unrolled stride and at aligned and unaligned offsets, against memcpy, with the
// bytes around the destinations untouched. And the two records kernels leave in host-mapped
// memory for a host that does not synchronise: the overlap ops' wait kernel's fault report
// (src/cuda/overlap/signals.cu) and TpMoe's count mismatch (src/cuda/moe/moe_tp_sum_kernels.cu).
// Built for the emulated device and for a GPU (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "cuda/all_to_all/device_utils.cuh"
#include "cuda/cuda_test_flavor.hpp"
#include "cuda/moe/moe_kernels.cuh"
#include "cuda/overlap/signals.cuh"

namespace pmoe::testing {
namespace {

struct CopyCase {
  int dst_offset, src_offset, bytes;
};

constexpr int kSlot = 2304;  // bytes per case in each buffer: the largest size plus offsets

// Block b copies case b within its own slot of the two buffers.
__global__ void copy_cases(const CopyCase* cases, std::byte* dst, const std::byte* src) {
  const CopyCase c = cases[blockIdx.x];
  cuda::block_copy(dst + size_t(blockIdx.x) * kSlot + c.dst_offset,
                   src + size_t(blockIdx.x) * kSlot + c.src_offset, size_t(c.bytes));
}

void expect_ok(cudaError_t status, const char* what) {
  ASSERT_EQ(status, cudaSuccess) << what << ": " << cudaGetErrorString(status);
}

TEST(DeviceUtils, BlockCopyAtEveryMisalignmentMatchesMemcpy) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  std::vector<CopyCase> cases;
  for (int d = 0; d < 18; ++d)
    for (int s = 0; s < 18; ++s)
      for (int bytes : {0, 1, 2, 3, 7, 8, 15, 16, 17, 33, 255, 257, 2063})
        cases.push_back({d, s, bytes});
  const size_t total = cases.size() * kSlot;
  std::vector<std::byte> src(total), dst(total, std::byte{0x5a}), want(total, std::byte{0x5a});
  for (size_t i = 0; i < total; ++i) src[i] = std::byte(uint8_t(i * 131 + i / 251));
  for (size_t b = 0; b < cases.size(); ++b)
    std::memcpy(want.data() + b * kSlot + cases[b].dst_offset,
                src.data() + b * kSlot + cases[b].src_offset, size_t(cases[b].bytes));

  CopyCase* device_cases = nullptr;
  std::byte *device_src = nullptr, *device_dst = nullptr;
  expect_ok(cudaMalloc(&device_cases, cases.size() * sizeof(CopyCase)), "cudaMalloc");
  expect_ok(cudaMalloc(&device_src, total), "cudaMalloc");
  expect_ok(cudaMalloc(&device_dst, total), "cudaMalloc");
  expect_ok(cudaMemcpy(device_cases, cases.data(), cases.size() * sizeof(CopyCase),
                       cudaMemcpyHostToDevice), "copy");
  expect_ok(cudaMemcpy(device_src, src.data(), total, cudaMemcpyHostToDevice), "copy");
  expect_ok(cudaMemcpy(device_dst, dst.data(), total, cudaMemcpyHostToDevice), "copy");
  expect_ok(cudaDeviceSynchronize(), "sync");
  // 64 threads: several words per thread for the longer cases, and a head and tail that do not
  // cover the block.
  cuda::launch_shaped(copy_cases, unsigned(cases.size()), 64, nullptr, device_cases, device_dst,
                      static_cast<const std::byte*>(device_src));
  expect_ok(cudaDeviceSynchronize(), "kernel");
  expect_ok(cudaMemcpy(dst.data(), device_dst, total, cudaMemcpyDeviceToHost), "copy back");
  for (size_t b = 0; b < cases.size(); ++b) {
    if (std::memcmp(dst.data() + b * kSlot, want.data() + b * kSlot, kSlot) == 0) continue;
    ADD_FAILURE() << "block_copy of " << cases[b].bytes << " bytes, destination offset "
                  << cases[b].dst_offset << ", source offset " << cases[b].src_offset
                  << ": the slot differs from memcpy's";
    break;
  }
  cudaFree(device_cases);
  cudaFree(device_src);
  cudaFree(device_dst);
}

struct MulticastCase {
  int src_offset, bytes, include_mask;
  int dst_offset[3];
};

constexpr int kArea = 9216;  // bytes per destination area (and source area) of a case

__global__ void multicast_cases(const MulticastCase* cases, std::byte* dst, const std::byte* src) {
  const MulticastCase c = cases[blockIdx.x];
  std::byte* areas = dst + size_t(blockIdx.x) * 3 * kArea;
  cuda::copy_to_each(
      3, [&](int i) { return (c.include_mask >> i & 1) != 0; },
      [&](int i) { return areas + size_t(i) * kArea + c.dst_offset[i]; },
      src + size_t(blockIdx.x) * kArea + c.src_offset, size_t(c.bytes));
}

TEST(DeviceUtils, CopyToEachMatchesMemcpyToEveryIncludedDestination) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  std::vector<MulticastCase> cases;
  const int offsets[][3] = {{0, 16, 48}, {0, 32, 8}, {3, 3, 3}, {64, 0, 16}};
  for (int src_offset : {0, 16, 5})
    for (const auto& dst : offsets)
      for (int bytes : {0, 5, 16, 31, 48, 1027, 4096, 4119, 9000})
        for (int mask : {7, 5, 2})
          cases.push_back({src_offset, bytes, mask, {dst[0], dst[1], dst[2]}});
  const size_t n = cases.size();
  std::vector<std::byte> src(n * kArea), dst(n * 3 * kArea, std::byte{0x5a});
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::byte(uint8_t(i * 131 + i / 251));
  std::vector<std::byte> want = dst;
  for (size_t b = 0; b < n; ++b)
    for (int i = 0; i < 3; ++i)
      if (cases[b].include_mask >> i & 1)
        std::memcpy(want.data() + (b * 3 + size_t(i)) * kArea + cases[b].dst_offset[i],
                    src.data() + b * kArea + cases[b].src_offset, size_t(cases[b].bytes));

  MulticastCase* device_cases = nullptr;
  std::byte *device_src = nullptr, *device_dst = nullptr;
  expect_ok(cudaMalloc(&device_cases, n * sizeof(MulticastCase)), "cudaMalloc");
  expect_ok(cudaMalloc(&device_src, src.size()), "cudaMalloc");
  expect_ok(cudaMalloc(&device_dst, dst.size()), "cudaMalloc");
  expect_ok(cudaMemcpy(device_cases, cases.data(), n * sizeof(MulticastCase),
                       cudaMemcpyHostToDevice), "copy");
  expect_ok(cudaMemcpy(device_src, src.data(), src.size(), cudaMemcpyHostToDevice), "copy");
  expect_ok(cudaMemcpy(device_dst, dst.data(), dst.size(), cudaMemcpyHostToDevice), "copy");
  expect_ok(cudaDeviceSynchronize(), "sync");
  // 64 threads: an unrolled stride of 4 KiB, so the larger cases take more than one.
  cuda::launch_shaped(multicast_cases, unsigned(n), 64, nullptr, device_cases, device_dst,
                      static_cast<const std::byte*>(device_src));
  expect_ok(cudaDeviceSynchronize(), "kernel");
  expect_ok(cudaMemcpy(dst.data(), device_dst, dst.size(), cudaMemcpyDeviceToHost), "copy back");
  for (size_t b = 0; b < n; ++b) {
    if (std::memcmp(dst.data() + b * 3 * kArea, want.data() + b * 3 * kArea, 3 * kArea) == 0)
      continue;
    const MulticastCase& c = cases[b];
    ADD_FAILURE() << "copy_to_each of " << c.bytes << " bytes from offset " << c.src_offset
                  << " to offsets " << c.dst_offset[0] << ", " << c.dst_offset[1] << ", "
                  << c.dst_offset[2] << " (mask " << c.include_mask
                  << "): the destinations differ from memcpy's";
    break;
  }
  cudaFree(device_cases);
  cudaFree(device_src);
  cudaFree(device_dst);
}

// The overlap ops' wait kernel (src/cuda/overlap/signals.cu) for a peer that never signals: it
// gives up and names the peer and the wait in the host-mapped fault word, which the host reads at
// the next call's entry without synchronising (FaultWord::read, for the overlap ops and TpMoe):
// once it sees the peer it must see which wait it was. Both sides are the library's own, so a
// relaxed release in the kernel or a relaxed acquire in the reader fails here.
TEST(OverlapSignals, ATimedOutWaitNamesItsPeerAndWaitToAHostThatDoesNotSynchronise) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  uint64_t* words = nullptr;  // the peer's signal word (never raised), then the call number
  ASSERT_EQ(cudaMalloc(&words, 2 * sizeof(uint64_t)), cudaSuccess);
  const uint64_t host_words[2] = {0, 1};
  ASSERT_EQ(cudaMemcpy(words, host_words, sizeof host_words, cudaMemcpyHostToDevice), cudaSuccess);
  {
    const cuda::FaultWord fault;
    EXPECT_FALSE(fault.read().has_value()) << "a fault before any wait";
    cuda::wait_for_signal(words, words + 1, 0, uint64_t(1e6), 3, cuda::kWaitDone, fault.device(),
                          nullptr);
    std::optional<cuda::OverlapFault> seen;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!(seen = fault.read()) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    ASSERT_TRUE(seen.has_value()) << "no fault within 20 s";
    EXPECT_EQ(seen->peer, 3);
    EXPECT_EQ(seen->what, cuda::kWaitDone) << "the host saw the peer before the wait it timed out in";
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  cudaFree(words);
}

// TpMoe's sum kernel (src/cuda/moe/moe_tp_sum_kernels.cu) for a rank that published another element
// count: it sums nothing and records (theirs, mine, peer), which TpMoe reads at its next call's
// entry without synchronising (CountMismatchRecord::take). Once the host sees the peer it must see
// that mismatch's counts, not the record's earlier ones, so a relaxed release in the kernel or a
// relaxed acquire in take() fails here. Twice, so that the second reader could see the first's.
TEST(TpMoeCountCheck, AMismatchNamesItsCountsToAHostThatDoesNotSynchronise) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  constexpr int kWorld = 3;
  constexpr int64_t kMine = 64;
  float* parts = nullptr;  // one region for every rank: nothing is summed on a mismatch
  uint64_t* counts = nullptr;
  const float** part_pointers = nullptr;
  const uint64_t** count_pointers = nullptr;
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&parts, kMine * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&counts, kWorld * sizeof(uint64_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&part_pointers, kWorld * sizeof(float*)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&count_pointers, kWorld * sizeof(uint64_t*)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, kMine * sizeof(float)), cudaSuccess);
  const float* host_parts[kWorld] = {parts, parts, parts};
  const uint64_t* host_counts[kWorld] = {counts, counts + 1, counts + 2};
  ASSERT_EQ(cudaMemcpy(part_pointers, host_parts, sizeof host_parts, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(count_pointers, host_counts, sizeof host_counts, cudaMemcpyHostToDevice),
            cudaSuccess);
  {
    cuda::CountMismatchRecord record;
    EXPECT_FALSE(record.take().has_value()) << "a mismatch before any sum";
    const struct {
      uint64_t counts[kWorld];
      int peer;
    } cases[] = {{{64, 48, 64}, 1}, {{64, 64, 100}, 2}};
    for (const auto& c : cases) {
      ASSERT_EQ(cudaMemcpy(counts, c.counts, sizeof c.counts, cudaMemcpyHostToDevice), cudaSuccess);
      cuda::SumPartials sum;
      sum.parts = part_pointers;
      sum.counts = count_pointers;
      sum.mismatch = record.device();
      sum.world = kWorld;
      sum.out = out;
      sum.n = kMine;
      cuda::launch_sum_partials(sum, DType::f32, nullptr);
      std::optional<cuda::CountMismatch> seen;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!(seen = record.take()) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
      ASSERT_TRUE(seen.has_value()) << "no mismatch within 20 s";
      EXPECT_EQ(seen->peer, c.peer);
      EXPECT_EQ(seen->theirs, int64_t(c.counts[c.peer])) << "the host saw the peer before its count";
      EXPECT_EQ(seen->mine, kMine) << "the host saw the peer before this rank's count";
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_FALSE(record.take().has_value()) << "a mismatch raised twice";
    }
  }
  cudaFree(parts);
  cudaFree(counts);
  cudaFree(part_pointers);
  cudaFree(count_pointers);
  cudaFree(out);
}

}  // namespace
}  // namespace pmoe::testing
