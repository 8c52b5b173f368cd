// One process, one thread, the emulated CUDA device: a kernel's misaligned 16-byte load, and a
// misaligned store through store_to_peer, end the process with "misaligned address", as they
// fault on a GPU (docs/emulated-device.md, "alignment"; src/cuda/emulator/misaligned_access.cpp),
// while the same accesses at aligned addresses run. This file is compiled with the alignment check
// pmoe's kernels get (PMOE_EMU_ALIGNMENT_CHECK, src/cuda/emulator/CMakeLists.txt), so its kernels
// are judged as theirs are. Emulator only: a GPU reports cudaErrorMisalignedAddress instead.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/launch.cuh"
#include "cuda/memory_ops.cuh"

namespace pmoe {
namespace {

__global__ void load_vector(const std::byte* src, int4* dst) {
  *dst = *reinterpret_cast<const int4*>(src);
}

__global__ void store_vector_to_peer(std::byte* dst) {
  cuda::store_to_peer(reinterpret_cast<int4*>(dst), int4{1, 2, 3, 4});
}

// Runs one thread of `kernel` on 16 bytes at `offset` into a fresh (page-aligned) allocation.
template <typename... Args>
void run_at(size_t offset, void (*kernel)(Args...)) {
  std::byte* buffer = nullptr;
  int4* output = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buffer), 64), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&output), sizeof(int4)), cudaSuccess);
  if constexpr (sizeof...(Args) == 2) {
    cuda::launch_shaped(kernel, dim3(1), dim3(1), nullptr, buffer + offset, output);
  } else {
    cuda::launch_shaped(kernel, dim3(1), dim3(1), nullptr, buffer + offset);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaFree(buffer), cudaSuccess);
  ASSERT_EQ(cudaFree(output), cudaSuccess);
}

TEST(EmulatedAlignment, AlignedVectorAccessesRun) {
  run_at(0, load_vector);
  run_at(16, load_vector);
  run_at(32, store_vector_to_peer);
}

// UBSan's alignment check in the kernel's translation unit, reported by the emulator's handler
// (or by UBSan's own under PMOE_SANITIZE=address: "16 byte alignment").
TEST(EmulatedAlignmentDeathTest, MisalignedVectorLoadEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run_at(8, load_vector), "misaligned address.*int4.*16.byte alignment");
}

// store_to_peer's own check: a held store is written later, bytewise, where UBSan sees nothing.
TEST(EmulatedAlignmentDeathTest, MisalignedStoreToPeerEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run_at(4, store_vector_to_peer),
               "misaligned address: store_to_peer of 16 bytes");
}

}  // namespace
}  // namespace pmoe
