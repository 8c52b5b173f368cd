// The BLAS wrapper against plain triple loops, on shapes that are not powers of two.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cpu/gemm.hpp"
#include "pmoe/error.hpp"
#include "reference/workload.hpp"

namespace pmoe {
namespace {

// C = A . B in double, from f32 or bf16 operands as gemm() reads them.
std::vector<double> naive(const Tensor& A, const Tensor& B) {
  const int64_t M = A.size(0), K = A.size(1), N = B.size(1);
  auto at = [](const Tensor& t, int64_t r, int64_t c) {
    return t.dtype() == DType::f32 ? double(t.data<float>()[r * t.stride(0) + c])
                                   : double(to_float(t.data<bf16>()[r * t.stride(0) + c]));
  };
  std::vector<double> C(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t p = 0; p < K; ++p) C[size_t(i * N + j)] += at(A, i, p) * at(B, p, j);
  return C;
}

void fill(const Buffer& b, uint64_t seed) {
  const Tensor t = b;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = 2.0f * reference::uniform(seed, uint64_t(i)) - 1.0f;
    if (t.dtype() == DType::f32) t.data<float>()[i] = v;
    else t.data<bf16>()[i] = to_bf16(v);
  }
}

TEST(Gemm, MatchesNaiveLoopsForEveryDtypeMix) {
  const int M = 37, K = 53, N = 29;
  for (DType a : {DType::f32, DType::bf16})
    for (DType b : {DType::f32, DType::bf16})
      for (DType c : {DType::f32, DType::bf16}) {
        Buffer A(a, {M, K}), B(b, {K, N}), C(c, {M, N});
        fill(A, 1);
        fill(B, 2);
        cpu::gemm(A, B, C);
        const auto want = naive(A, B);
        const double tolerance = c == DType::f32 ? 1e-5 : 1e-2;  // bf16 output: 8-bit mantissa
        for (int i = 0; i < M * N; ++i) {
          const double got = c == DType::f32 ? C.data<float>()[i] : to_float(C.data<bf16>()[i]);
          ASSERT_NEAR(got, want[size_t(i)], tolerance * (1 + std::abs(want[size_t(i)])))
              << dtype_name(a) << dtype_name(b) << dtype_name(c) << " element " << i;
        }
      }
}

TEST(Gemm, BetaAccumulatesIntoC) {
  Buffer A(DType::f32, {3, 4}), B(DType::f32, {4, 5}), C(DType::f32, {3, 5});
  fill(A, 3);
  fill(B, 4);
  for (int i = 0; i < 15; ++i) C.data<float>()[i] = 1.0f;
  cpu::gemm(A, B, C, 1.0f);
  const auto want = naive(A, B);
  for (int i = 0; i < 15; ++i) EXPECT_NEAR(C.data<float>()[i], want[size_t(i)] + 1.0, 1e-5);
}

TEST(Gemm, RejectsMismatchedShapes) {
  Buffer A(DType::f32, {3, 4}), B(DType::f32, {5, 2}), C(DType::f32, {3, 2});
  try {
    cpu::gemm(A, B, C);
    FAIL() << "accepted K mismatch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("B must have K = 4 rows"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pmoe
