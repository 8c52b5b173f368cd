// cuBLAS on the emulated device (cublas_api.hpp): each GEMM is one closure on the handle's
// stream, which widens 16-bit operands to f32, calls the host BLAS column-major, and rounds C back.
#include "cuda/emulator/cublas_api.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/emulator/half_types.hpp"
#include "cuda/emulator/streams.hpp"

namespace pmoe::emu {

struct CublasContext {
  cuda_api::cudaStream_t stream = nullptr;  // nullptr: the legacy stream, as in cuBLAS
};

namespace cublas_api {
namespace {

int element_bytes(cudaDataType type) { return type == CUDA_R_32F ? 4 : 2; }

bool known_type(cudaDataType type) {
  return type == CUDA_R_32F || type == CUDA_R_16F || type == CUDA_R_16BF;
}

float load(const void* base, cudaDataType type, int64_t i) {
  switch (type) {
    case CUDA_R_16F: return __half2float(static_cast<const __half*>(base)[i]);
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

void store(void* base, cudaDataType type, int64_t i, float value) {
  switch (type) {
    case CUDA_R_16F: static_cast<__half*>(base)[i] = __float2half_rn(value); break;
    case CUDA_R_16BF: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(value); break;
    default: static_cast<float*>(base)[i] = value;
  }
}

// f32 to TF32 (1 sign, 8 exponent, 10 mantissa bits), to nearest even, kept in an f32: what a
// tensor core multiplies under CUBLAS_COMPUTE_32F_FAST_TF32. Inf and NaN pass unchanged.
float round_to_tf32(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u) return value;
  bits += 0xfffu + ((bits >> 13) & 1u);
  bits &= ~0x1fffu;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// A column-major matrix of `rows` x `cols` with leading dimension `ld`, as f32 with the same ld
// (rounded to TF32 where `tf32`).
std::vector<float> widened(const void* base, cudaDataType type, int rows, int cols, int ld,
                           bool tf32 = false) {
  std::vector<float> out(size_t(ld) * size_t(cols > 0 ? cols - 1 : 0) + size_t(rows));
  for (int c = 0; c < cols; ++c)
    for (int r = 0; r < rows; ++r) {
      const int64_t i = int64_t(c) * ld + r;
      const float v = load(base, type, i);
      out[size_t(i)] = tf32 ? round_to_tf32(v) : v;
    }
  return out;
}

struct Operand {
  const void* data;
  cudaDataType type;
  int ld;
  long long stride;
  const void* const* array = nullptr;  // cublasGemmBatchedEx: one pointer a GEMM, read at run
};

struct Gemm {
  CBLAS_TRANSPOSE ta, tb;
  int m, n, k;
  float alpha, beta;
  Operand a, b;
  void* c;
  cudaDataType c_type;
  int ldc;
  long long stride_c;
  int batch;
  void* const* c_array = nullptr;
  bool tf32 = false;  // CUBLAS_COMPUTE_32F_FAST_TF32: f32 inputs rounded to TF32
};

// The i-th GEMM's matrix: the array's pointer (read when the stream runs the GEMM, as cuBLAS
// reads its device arrays), or base + i * stride elements.
const char* matrix(const Operand& o, int i) {
  if (o.array) return static_cast<const char*>(o.array[i]);
  return static_cast<const char*>(o.data) + i * o.stride * element_bytes(o.type);
}

void run_one(const Gemm& g, int i) {
  const char* a = matrix(g.a, i);
  const char* b = matrix(g.b, i);
  char* c = g.c_array ? static_cast<char*>(g.c_array[i])
                      : static_cast<char*>(g.c) + i * g.stride_c * element_bytes(g.c_type);
  // Stored shapes (column-major): A is m x k, or k x m when transposed; B likewise.
  const int a_rows = g.ta == CblasNoTrans ? g.m : g.k, a_cols = g.ta == CblasNoTrans ? g.k : g.m;
  const int b_rows = g.tb == CblasNoTrans ? g.k : g.n, b_cols = g.tb == CblasNoTrans ? g.n : g.k;
  std::vector<float> a32, b32, c32;
  const float* pa = reinterpret_cast<const float*>(a);
  const float* pb = reinterpret_cast<const float*>(b);
  if (g.a.type != CUDA_R_32F || g.tf32)
    pa = (a32 = widened(a, g.a.type, a_rows, a_cols, g.a.ld, g.tf32)).data();
  if (g.b.type != CUDA_R_32F || g.tf32)
    pb = (b32 = widened(b, g.b.type, b_rows, b_cols, g.b.ld, g.tf32)).data();
  if (g.k == 0) {
    // No products: C = beta * C (cuBLAS's result; the host BLAS may not accept k == 0).
    for (int col = 0; col < g.n; ++col)
      for (int r = 0; r < g.m; ++r) {
        const int64_t at = int64_t(col) * g.ldc + r;
        store(c, g.c_type, at, g.beta == 0.0f ? 0.0f : g.beta * load(c, g.c_type, at));
      }
    return;
  }
  if (g.c_type == CUDA_R_32F) {
    float* pc = reinterpret_cast<float*>(c);
    if (g.beta == 0.0f)  // C is not read: clear it, so NaNs in it stay out
      for (int col = 0; col < g.n; ++col) std::memset(pc + int64_t(col) * g.ldc, 0, sizeof(float) * size_t(g.m));
    cblas_sgemm(CblasColMajor, g.ta, g.tb, g.m, g.n, g.k, g.alpha, pa, std::max(g.a.ld, 1), pb,
                std::max(g.b.ld, 1), g.beta, pc, std::max(g.ldc, 1));
    return;
  }
  c32.assign(size_t(g.ldc) * size_t(g.n - 1) + size_t(g.m), 0.0f);
  if (g.beta != 0.0f) c32 = widened(c, g.c_type, g.m, g.n, g.ldc);
  cblas_sgemm(CblasColMajor, g.ta, g.tb, g.m, g.n, g.k, g.alpha, pa, std::max(g.a.ld, 1), pb,
              std::max(g.b.ld, 1), g.beta, c32.data(), std::max(g.ldc, 1));
  for (int col = 0; col < g.n; ++col)
    for (int r = 0; r < g.m; ++r) {
      const int64_t at = int64_t(col) * g.ldc + r;
      store(c, g.c_type, at, c32[size_t(at)]);
    }
}

bool valid_op(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T; }

cublasStatus_t enqueue_gemm(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            Operand a, Operand b, const void* beta, void* C, cudaDataType c_type,
                            int ldc, long long stride_c, int batch,
                            cublasComputeType_t compute, void* const* c_array = nullptr) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!known_type(a.type) || !known_type(b.type) || !known_type(c_type) ||
      (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  // cuBLAS's own checks: sizes, leading dimensions at least the stored rows, real operations.
  const int a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
  if ((a.array != nullptr) != (c_array != nullptr) || (b.array != nullptr) != (c_array != nullptr))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!valid_op(transa) || !valid_op(transb) || m < 0 || n < 0 || k < 0 || batch < 0 ||
      alpha == nullptr || beta == nullptr || a.ld < std::max(1, a_rows) ||
      b.ld < std::max(1, b_rows) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  const Gemm gemm{transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                  transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                  m, n, k, *static_cast<const float*>(alpha), *static_cast<const float*>(beta),
                  a, b, C, c_type, ldc, stride_c, batch, c_array,
                  compute == CUBLAS_COMPUTE_32F_FAST_TF32};
  const cudaError_t status = enqueue(handle->stream, [gemm] {
    for (int i = 0; i < gemm.batch; ++i) run_one(gemm, i);
  });
  if (status != cudaSuccess) {
    note_error(status);
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new CublasContext{};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
  }
  return "unknown error";
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t) {
  return enqueue_gemm(handle, transa, transb, m, n, k, alpha, {A, Atype, lda, 0}, {B, Btype, ldb, 0},
                      beta, C, Ctype, ldc, 0, 1, computeType);
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType Atype, int lda, long long strideA,
    const void* B, cudaDataType Btype, int ldb, long long strideB, const void* beta, void* C,
    cudaDataType Ctype, int ldc, long long strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t) {
  return enqueue_gemm(handle, transa, transb, m, n, k, alpha, {A, Atype, lda, strideA},
                      {B, Btype, ldb, strideB}, beta, C, Ctype, ldc, strideC, batchCount,
                      computeType);
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                   cublasOperation_t transb, int m, int n, int k,
                                   const void* alpha, const void* const Aarray[],
                                   cudaDataType Atype, int lda, const void* const Barray[],
                                   cudaDataType Btype, int ldb, const void* beta,
                                   void* const Carray[], cudaDataType Ctype, int ldc,
                                   int batchCount, cublasComputeType_t computeType,
                                   cublasGemmAlgo_t) {
  if (batchCount > 0 && (Aarray == nullptr || Barray == nullptr || Carray == nullptr))
    return CUBLAS_STATUS_INVALID_VALUE;
  return enqueue_gemm(handle, transa, transb, m, n, k, alpha, {nullptr, Atype, lda, 0, Aarray},
                      {nullptr, Btype, ldb, 0, Barray}, beta, nullptr, Ctype, ldc, 0, batchCount,
                      computeType, Carray);
}

}  // namespace cublas_api
}  // namespace pmoe::emu
