// One process, one thread, the emulated CUDA device's runtime called directly: the allocator's
// count of device memory and its peak (src/cuda/emulator/memory.cpp), which pmoe-bench moe
// --device cuda reports. Emulator only: CUDA's allocator keeps no peak.
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <unistd.h>

namespace pmoe {
namespace {

TEST(EmulatedMemory, PeakHoldsTheMostAllocatedUntilReset) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);  // a device nothing else here uses
  emu::reset_memory_peak(1);
  const emu::MemoryUse before = emu::memory_use(1);
  EXPECT_EQ(before.peak, before.in_use);

  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 3 * page), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 1), cudaSuccess);  // page-rounded
  EXPECT_EQ(emu::memory_use(1).in_use, before.in_use + 4 * page);
  EXPECT_EQ(emu::memory_use(0).in_use, 0u) << "device 0 counts device 1's memory";
  ASSERT_EQ(cudaFree(a), cudaSuccess);
  const emu::MemoryUse after_free = emu::memory_use(1);
  EXPECT_EQ(after_free.in_use, before.in_use + page);
  EXPECT_EQ(after_free.peak, before.in_use + 4 * page);  // freeing keeps the peak

  emu::reset_memory_peak(1);
  EXPECT_EQ(emu::memory_use(1).peak, before.in_use + page);
  ASSERT_EQ(cudaFree(b), cudaSuccess);
  EXPECT_EQ(emu::memory_use(1).in_use, before.in_use);
}

}  // namespace
}  // namespace pmoe
