// Row-major GEMMs through cuBLAS (column-major) on the handle's stream, for the overlap ops and
// the MoE layers on a device: f32 or bf16 operands, f32 accumulation, C rounded once, as the CPU
// backend's BLAS path. On the emulated device cuBLAS is the shim in src/cuda/emulator. In the
// GEMM room, which both ops use, so that neither op's folder includes the other's.
#pragma once

#include <cublas_v2.h>

#include "cuda/flavor.hpp"
#include "pmoe/dtype.hpp"
#include "pmoe/error.hpp"

#define PMOE_CUBLAS_CHECK(call)                                                              \
  do {                                                                                       \
    const cublasStatus_t pmoe_status_ = (call);                                              \
    if (pmoe_status_ != CUBLAS_STATUS_SUCCESS)                                               \
      throw ::pmoe::Error(::pmoe::detail::cat(#call, " failed at ", __FILE__, ":", __LINE__, \
                                              ": ", cublasGetStatusString(pmoe_status_)));   \
  } while (0)

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

inline cudaDataType cublas_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: throw Error(detail::cat("cuBLAS GEMM: no element type for ", dtype_name(dtype)));
  }
}

// C [m, n] = A [m, k] . B [k, n] + beta C, row-major with leading dimensions, all `dtype`.
// Row-major C is column-major C^T = B^T . A^T: cuBLAS multiplies B by A with m and n swapped.
inline void gemm_row_major(cublasHandle_t handle, DType dtype, int m, int n, int k, const void* A,
                           int lda, const void* B, int ldb, void* C, int ldc, float beta = 0.0f) {
  if (m == 0 || n == 0) return;
  const float alpha = 1.0f;
  const cudaDataType type = cublas_type(dtype);
  PMOE_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, B, type, ldb, A,
                                 type, lda, &beta, C, type, ldc, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

// As gemm_row_major, with C in f32 (not rounded to the operands' dtype): for partial products
// that are summed before their one rounding.
inline void gemm_row_major_f32_out(cublasHandle_t handle, DType dtype, int m, int n, int k,
                                   const void* A, int lda, const void* B, int ldb, float* C,
                                   int ldc) {
  if (m == 0 || n == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType type = cublas_type(dtype);
  PMOE_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, B, type, ldb, A,
                                 type, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
