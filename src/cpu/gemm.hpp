// GEMM on the CPU backend, through a real BLAS (OpenBLAS by default, found by CMake's FindBLAS).
// Row-major throughout, like every pmoe Tensor. pmoe never hand-writes a GEMM.
#pragma once

#include "pmoe/tensor.hpp"

namespace pmoe::cpu {

// C[M, N] = A[M, K] . B[K, N] + beta * C, all f32, row-major with leading dimensions
// (elements between consecutive rows). `transpose_b` reads B as [N, K] instead.
void gemm_f32(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C,
              int ldc, float beta = 0.0f, bool transpose_b = false);

// The same over Tensors: A [M, K], B [K, N], C [M, N], each f32 or bf16 (any mix). bf16 operands
// are widened to f32 and C is accumulated in f32 and rounded once (round to nearest even).
// Views must be row-major with unit stride in the last dimension. Throws pmoe::Error on shape,
// dtype or device mismatch.
void gemm(const Tensor& A, const Tensor& B, const Tensor& C, float beta = 0.0f);

// Threads BLAS may use per call. Thread ranks call BLAS concurrently, so tools set this to
// cores / ranks (at least 1) instead of letting BLAS oversubscribe the machine.
void set_blas_threads(int threads);
int blas_threads();

}  // namespace pmoe::cpu
