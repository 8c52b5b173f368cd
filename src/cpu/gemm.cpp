#include "cpu/gemm.hpp"

#include <cblas.h>

#include <vector>

#include "core/arg_checks.hpp"
#include "pmoe/error.hpp"

namespace pmoe::cpu {
namespace {

// f32 view of a 2-D tensor: the data itself when it is f32, else a widened copy in `scratch`.
const float* as_f32(const Tensor& t, std::vector<float>& scratch, int64_t& ld) {
  ld = t.stride(0);
  if (t.dtype() == DType::f32) return t.data<float>();
  const int64_t rows = t.size(0), cols = t.size(1);
  scratch.resize(size_t(rows * cols));
  const bf16* src = t.data<bf16>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) scratch[size_t(r * cols + c)] = to_float(src[r * ld + c]);
  ld = cols;
  return scratch.data();
}

void check_operand(const char* name, const Tensor& t) {
  PMOE_CHECK(t.dim() == 2, "gemm: `", name, "` must be 2-D, got ", t.shape_str());
  PMOE_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, "gemm: `", name,
             "` must be f32 or bf16 (float32 or bfloat16), got ", detail::dtype_words(t.dtype()));
  PMOE_CHECK(t.device() == Device::cpu(), "gemm: `", name, "` must be on cpu, got ",
             t.device().str());
  PMOE_CHECK(t.stride(1) == 1 && t.stride(0) >= t.size(1), "gemm: `", name,
             "` must be row-major with unit stride in its last dimension");
}

}  // namespace

void gemm_f32(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C,
              int ldc, float beta, bool transpose_b) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, M, N, K,
              1.0f, A, lda, B, ldb, beta, C, ldc);
}

void gemm(const Tensor& A, const Tensor& B, const Tensor& C, float beta) {
  check_operand("A", A);
  check_operand("B", B);
  check_operand("C", C);
  const int64_t M = A.size(0), K = A.size(1), N = B.size(1);
  PMOE_CHECK(B.size(0) == K, "gemm: A is ", A.shape_str(), " but B is ", B.shape_str(),
             "; B must have K = ", K, " rows");
  PMOE_CHECK(C.size(0) == M && C.size(1) == N, "gemm: C must be [", M, ", ", N, "], got ",
             C.shape_str());
  std::vector<float> a_scratch, b_scratch;
  int64_t lda, ldb;
  const float* a = as_f32(A, a_scratch, lda);
  const float* b = as_f32(B, b_scratch, ldb);
  if (C.dtype() == DType::f32) {
    gemm_f32(int(M), int(N), int(K), a, int(lda), b, int(ldb), C.data<float>(), int(C.stride(0)),
             beta);
    return;
  }
  std::vector<float> c_scratch;
  int64_t ldc;
  float* c = const_cast<float*>(as_f32(C, c_scratch, ldc));
  gemm_f32(int(M), int(N), int(K), a, int(lda), b, int(ldb), c, int(ldc), beta);
  bf16* out = C.data<bf16>();
  for (int64_t r = 0; r < M; ++r)
    for (int64_t col = 0; col < N; ++col) out[r * C.stride(0) + col] = to_bf16(c[r * N + col]);
}

void set_blas_threads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }

int blas_threads() { return openblas_get_num_threads(); }

}  // namespace pmoe::cpu
