#include <gtest/gtest.h>

#include <cstdint>

#include "pmoe/error.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe {
namespace {

TEST(Tensor, ContiguousViewHasRowMajorStrides) {
  float data[24];
  Tensor t(data, DType::f32, {2, 3, 4});
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(1), 4);
  EXPECT_EQ(t.stride(2), 1);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.shape_str(), "[2, 3, 4]");
}

TEST(Tensor, StridedViewIsNotContiguous) {
  float data[16];
  const int64_t shape[] = {4, 2}, strides[] = {4, 1};  // every other pair of a [4, 4] matrix
  Tensor t(data, DType::f32, 2, shape, strides);
  EXPECT_FALSE(t.is_contiguous());
}

TEST(Tensor, ZeroRowsAreContiguousWhateverTheStrides) {
  const int64_t shape[] = {0, 8}, strides[] = {0, 0};  // what some frameworks report for m = 0
  EXPECT_TRUE(Tensor(nullptr, DType::f32, 2, shape, strides).is_contiguous());
}

TEST(Tensor, EmptyTensorStandsForAbsentArgument) {
  Tensor t;
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.numel(), 0);
  float one;
  EXPECT_FALSE(Tensor(&one, DType::f32, {1}).empty());
}

TEST(Tensor, RejectsTooManyDimsAndNegativeExtents) {
  float data[1];
  EXPECT_THROW(Tensor(data, DType::f32, {1, 1, 1, 1, 1}), Error);
  EXPECT_THROW(Tensor(data, DType::f32, {2, -1}), Error);
}

TEST(Buffer, IsZeroedAnd64ByteAligned) {
  Buffer b(DType::bf16, {3, 5});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data<void>()) % 64, 0u);
  EXPECT_EQ(b.nbytes(), 30u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(b.data<bf16>()[i].bits, 0);
  Buffer empty_rows(DType::f32, {0, 8});  // m = 0 is a valid batch
  EXPECT_EQ(empty_rows.nbytes(), 0u);
  EXPECT_NE(empty_rows.data<void>(), nullptr);
}

TEST(Device, Names) {
  EXPECT_EQ(Device::cpu().str(), "cpu");
  EXPECT_EQ(Device::cuda(3).str(), "cuda:3");
}

}  // namespace
}  // namespace pmoe
