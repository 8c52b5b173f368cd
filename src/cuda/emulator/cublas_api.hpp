// cuBLAS on the emulated device: the calls pmoe makes, with cuBLAS's signatures and enum values,
// so code written for cuBLAS compiles unchanged against the stand-in <cublas_v2.h>. A GEMM is
// enqueued on the handle's stream and runs there, in stream order, through the host BLAS
// (OpenBLAS, as the CPU backend): 16-bit operands are widened to f32 (exactly), accumulated in
// f32 and C is rounded once to its type, as cuBLAS does with f32 compute (CUBLAS_COMPUTE_32F);
// with CUBLAS_COMPUTE_32F_FAST_TF32, f32 operands are first rounded to TF32 as the tensor cores
// take them. Only the summation order differs from a GPU's. Column-major, as cuBLAS. The names live in
// pmoe::emu::cublas_api, made global by a using-directive as the runtime API's are.
//
// Kept from cuBLAS because callers rely on it:
// - alpha and beta are host pointers (CUBLAS_POINTER_MODE_HOST), read when the call is made, so a
//   captured GEMM replays with the values of the capture;
// - with beta == 0, C is not read (it may hold NaNs);
// - invalid arguments return CUBLAS_STATUS_INVALID_VALUE and enqueue nothing.
#pragma once

#include "cuda/emulator/runtime_api.hpp"

namespace pmoe::emu {

struct CublasContext;

namespace cublas_api {

using cublasHandle_t = CublasContext*;

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
// library_types.h in CUDA; the three element types pmoe multiplies.
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
using cudaDataType = cudaDataType_t;
// 32F: f32 accumulation of the inputs as they are; 32F_FAST_TF32: f32 inputs rounded to TF32
// (10 mantissa bits, to nearest even) first, as tensor cores take them; 16-bit inputs as 32F.
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream);
const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);

// C = alpha * op(A) . op(B) + beta * C, column-major; op(A) is m x k, op(B) k x n, C m x n.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);
// batchCount GEMMs, the i-th on A + i * strideA, B + i * strideB, C + i * strideC (elements).
cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType Atype, int lda, long long strideA,
    const void* B, cudaDataType Btype, int ldb, long long strideB, const void* beta, void* C,
    cudaDataType Ctype, int ldc, long long strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo);
// batchCount GEMMs, the i-th on Aarray[i], Barray[i], Carray[i]: arrays of device pointers that
// the stream reads when it runs the GEMMs (so a kernel before them on the stream may write them).
cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                   cublasOperation_t transb, int m, int n, int k,
                                   const void* alpha, const void* const Aarray[],
                                   cudaDataType Atype, int lda, const void* const Barray[],
                                   cudaDataType Btype, int ldb, const void* beta,
                                   void* const Carray[], cudaDataType Ctype, int ldc,
                                   int batchCount, cublasComputeType_t computeType,
                                   cublasGemmAlgo_t algo);

}  // namespace cublas_api
}  // namespace pmoe::emu

using namespace pmoe::emu::cublas_api;  // NOLINT: cuBLAS's names are global in cuBLAS's header
