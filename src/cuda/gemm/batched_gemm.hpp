// Row-major GEMMs through cuBLAS for the MoE layers on a device: a batch of equal-sized f32 ones
// at fixed strides (cublasGemmStridedBatchedEx, the router), or the experts' at addresses in
// device arrays that a kernel before them wrote (cublasGemmBatchedEx); on the emulated device the shim in
// src/cuda/emulator/cublas.cpp. Row-major C = A . B is column-major C^T = B^T . A^T, so
// cuBLAS is called with B first and m, n swapped.
#pragma once

#include <cstdint>

#include "cuda/gemm/cublas_gemm.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

// For b < batch: C_b [m, n] = A_b [m, k] . B_b [k, n], A_b = A + b * stride_a (elements), ...
inline void gemm_batched_row_major(cublasHandle_t handle, int m, int n, int k, const float* A,
                                   int lda, int64_t stride_a, const float* B, int ldb,
                                   int64_t stride_b, float* C, int ldc, int64_t stride_c,
                                   int batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  PMOE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, B,
                                               CUDA_R_32F, ldb, stride_b, A, CUDA_R_32F, lda,
                                               stride_a, &beta, C, CUDA_R_32F, ldc, stride_c, batch,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The expert GEMMs' types: inputs (A and B) in the layer's dtype, C in f32, f32 accumulation.
// bf16 (or f16) inputs run on tensor cores; f32 inputs run in f32, or on TF32 tensor cores
// (inputs rounded to TF32) when `tf32`.
struct ExpertGemmTypes {
  DType inputs = DType::f32;
  bool tf32 = false;
  cublasComputeType_t compute() const {
    return tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  }
};

// For b < batch: *C[b] [m, n] f32 = *A[b] [m, k] . *B[b] [k, n] (A and B of types.inputs); A, B
// and C are device arrays of device pointers, read when the stream runs the GEMMs.
inline void gemm_arrays_row_major(cublasHandle_t handle, ExpertGemmTypes types, int m, int n,
                                  int k, const void* const* A, int lda, const void* const* B,
                                  int ldb, void* const* C, int ldc, int batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType in = cublas_type(types.inputs);
  PMOE_CUBLAS_CHECK(cublasGemmBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, B, in,
                                        ldb, A, in, lda, &beta, C, CUDA_R_32F, ldc, batch,
                                        types.compute(), CUBLAS_GEMM_DEFAULT));
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
