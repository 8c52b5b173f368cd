// One device, one host thread: cuBLAS's GEMMs (on the emulated device, the shim that runs the host
// BLAS on the streams: src/cuda/emulator/cublas_api.hpp) against a plain triple loop in double,
// for f32, f16 and bf16 with f32 compute, both transposes, padded leading dimensions, batches,
// beta == 0 over NaNs, k == 0, stream order, graph capture, rejected arguments, and batches
// whose matrices device arrays of pointers name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

// After the standard headers: the emulated device's defines qualifiers such as __noinline__.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda/cuda_test_flavor.hpp"
#include "pmoe/dtype.hpp"

namespace pmoe::testing {
namespace {

void expect_ok(cudaError_t status, const char* what) {
  ASSERT_EQ(status, cudaSuccess) << what << ": " << cudaGetErrorString(status);
}
void expect_ok(cublasStatus_t status, const char* what) {
  ASSERT_EQ(status, CUBLAS_STATUS_SUCCESS) << what << ": " << int(status);
}

int bytes_of(cudaDataType type) { return type == CUDA_R_32F ? 4 : 2; }

// Host matrices kept as the f32 values the device type can hold (rounded once), plus the bytes.
struct HostMatrix {
  cudaDataType type;
  std::vector<float> values;      // rounded to `type`
  std::vector<uint8_t> bytes;     // what goes to the device

  HostMatrix(cudaDataType t, size_t count) : type(t), values(count), bytes(count * bytes_of(t)) {}
  void set(size_t i, float v) {
    if (type == CUDA_R_32F) {
      values[i] = v;
      std::memcpy(&bytes[i * 4], &v, 4);
      return;
    }
    const uint16_t bits = type == CUDA_R_16F ? to_f16(v).bits : to_bf16(v).bits;
    values[i] = type == CUDA_R_16F ? to_float(f16{bits}) : to_float(bf16{bits});
    std::memcpy(&bytes[i * 2], &bits, 2);
  }
  float from_bytes(size_t i) const {
    if (type == CUDA_R_32F) {
      float v;
      std::memcpy(&v, &bytes[i * 4], 4);
      return v;
    }
    uint16_t bits;
    std::memcpy(&bits, &bytes[i * 2], 2);
    return type == CUDA_R_16F ? to_float(f16{bits}) : to_float(bf16{bits});
  }
};

HostMatrix random_matrix(cudaDataType type, size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  HostMatrix m(type, count);
  for (size_t i = 0; i < count; ++i) m.set(i, dist(rng));
  return m;
}

// One relative unit in the last place of the output type (f32 compute, rounded once).
double tolerance(cudaDataType c_type, int k) {
  const double eps = c_type == CUDA_R_32F ? 1e-6 : c_type == CUDA_R_16F ? 1.0 / 1024 : 1.0 / 128;
  return eps * 2 + 1e-6 * k;
}

struct Case {
  cudaDataType type;
  cublasOperation_t ta, tb;
};

class CublasGemm : public ::testing::TestWithParam<Case> {};

// C = alpha op(A) op(B) + beta C, column-major, every operand padded (ld > rows), batch of 3.
TEST_P(CublasGemm, StridedBatchedMatchesALoop) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const Case p = GetParam();
  const int m = 7, n = 5, k = 9, batch = 3;
  const int a_rows = p.ta == CUBLAS_OP_N ? m : k, a_cols = p.ta == CUBLAS_OP_N ? k : m;
  const int b_rows = p.tb == CUBLAS_OP_N ? k : n, b_cols = p.tb == CUBLAS_OP_N ? n : k;
  const int lda = a_rows + 2, ldb = b_rows + 1, ldc = m + 3;
  const long long sa = lda * a_cols + 4, sb = ldb * b_cols, sc = ldc * n + 1;
  std::mt19937 rng(7 + int(p.type) * 4 + int(p.ta) * 2 + int(p.tb));
  HostMatrix A = random_matrix(p.type, size_t(sa * batch), rng);
  HostMatrix B = random_matrix(p.type, size_t(sb * batch), rng);
  HostMatrix C = random_matrix(p.type, size_t(sc * batch), rng);
  const float alpha = 1.5f, beta = 0.5f;

  void *dA, *dB, *dC;
  expect_ok(cudaMalloc(&dA, A.bytes.size()), "cudaMalloc");
  expect_ok(cudaMalloc(&dB, B.bytes.size()), "cudaMalloc");
  expect_ok(cudaMalloc(&dC, C.bytes.size()), "cudaMalloc");
  cudaStream_t stream;
  expect_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  // Stream order: the copies and the GEMM are all on `stream`, no sync between them.
  expect_ok(cudaMemcpyAsync(dA, A.bytes.data(), A.bytes.size(), cudaMemcpyHostToDevice, stream), "copy");
  expect_ok(cudaMemcpyAsync(dB, B.bytes.data(), B.bytes.size(), cudaMemcpyHostToDevice, stream), "copy");
  expect_ok(cudaMemcpyAsync(dC, C.bytes.data(), C.bytes.size(), cudaMemcpyHostToDevice, stream), "copy");
  cublasHandle_t handle;
  expect_ok(cublasCreate(&handle), "cublasCreate");
  expect_ok(cublasSetStream(handle, stream), "cublasSetStream");
  expect_ok(cublasGemmStridedBatchedEx(handle, p.ta, p.tb, m, n, k, &alpha, dA, p.type, lda, sa, dB,
                                       p.type, ldb, sb, &beta, dC, p.type, ldc, sc, batch,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx");
  HostMatrix out(p.type, C.values.size());
  expect_ok(cudaMemcpyAsync(out.bytes.data(), dC, out.bytes.size(), cudaMemcpyDeviceToHost, stream), "copy");
  expect_ok(cudaStreamSynchronize(stream), "sync");

  auto a_at = [&](int b, int r, int c) {  // op(A)[r, c]
    return double(A.values[size_t(b * sa + (p.ta == CUBLAS_OP_N ? c * lda + r : r * lda + c))]);
  };
  auto b_at = [&](int b, int r, int c) {
    return double(B.values[size_t(b * sb + (p.tb == CUBLAS_OP_N ? c * ldb + r : r * ldb + c))]);
  };
  for (int b = 0; b < batch; ++b)
    for (int c = 0; c < n; ++c)
      for (int r = 0; r < m; ++r) {
        double want = beta * C.values[size_t(b * sc + c * ldc + r)];
        for (int x = 0; x < k; ++x) want += alpha * a_at(b, r, x) * b_at(b, x, c);
        const double got = out.from_bytes(size_t(b * sc + c * ldc + r));
        ASSERT_NEAR(got, want, tolerance(p.type, k) * (1 + std::abs(want)))
            << "batch " << b << " C[" << r << ", " << c << "]";
      }
  // The padding between columns and batches is not written.
  for (int b = 0; b < batch; ++b)
    for (int c = 0; c < n; ++c)
      for (int r = m; r < ldc; ++r)
        ASSERT_EQ(out.from_bytes(size_t(b * sc + c * ldc + r)), C.values[size_t(b * sc + c * ldc + r)]);
  expect_ok(cublasDestroy(handle), "cublasDestroy");
  expect_ok(cudaStreamDestroy(stream), "stream");
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(dC);
}

INSTANTIATE_TEST_SUITE_P(
    TypesAndTransposes, CublasGemm,
    ::testing::Values(Case{CUDA_R_32F, CUBLAS_OP_N, CUBLAS_OP_N}, Case{CUDA_R_32F, CUBLAS_OP_T, CUBLAS_OP_N},
                      Case{CUDA_R_32F, CUBLAS_OP_N, CUBLAS_OP_T}, Case{CUDA_R_16F, CUBLAS_OP_N, CUBLAS_OP_N},
                      Case{CUDA_R_16F, CUBLAS_OP_T, CUBLAS_OP_T}, Case{CUDA_R_16BF, CUBLAS_OP_N, CUBLAS_OP_N},
                      Case{CUDA_R_16BF, CUBLAS_OP_T, CUBLAS_OP_N}, Case{CUDA_R_16BF, CUBLAS_OP_N, CUBLAS_OP_T}),
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      const char* t = c.type == CUDA_R_32F ? "f32" : c.type == CUDA_R_16F ? "f16" : "bf16";
      return std::string(t) + (c.ta == CUBLAS_OP_N ? "_N" : "_T") + (c.tb == CUBLAS_OP_N ? "N" : "T");
    });

// cublasGemmBatchedEx (the MoE layers' tiled experts): GEMM i on the matrices that device
// arrays of pointers name, in any order and sharing an operand, arrays copied in on the stream
// just before the call (cuBLAS reads them when the stream runs it). Every C against the loop.
TEST(CublasGemmBatched, PointerArraysReadInStreamOrder) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  for (cudaDataType type : {CUDA_R_32F, CUDA_R_16BF}) {
    const int m = 5, n = 6, k = 7, lda = m + 1, ldb = k, ldc = m + 2, batch = 3;
    const size_t a_size = size_t(lda) * k, b_size = size_t(ldb) * n, c_size = size_t(ldc) * n;
    std::mt19937 rng(11 + int(type));
    HostMatrix A = random_matrix(type, 2 * a_size, rng);
    HostMatrix B = random_matrix(type, batch * b_size, rng);
    HostMatrix C(type, batch * c_size);
    char *dA, *dB, *dC;
    expect_ok(cudaMalloc(&dA, A.bytes.size()), "cudaMalloc");
    expect_ok(cudaMalloc(&dB, B.bytes.size()), "cudaMalloc");
    expect_ok(cudaMalloc(&dC, C.bytes.size()), "cudaMalloc");
    const size_t e = size_t(bytes_of(type));
    // GEMM i: A block a_of[i] (0 twice), B block batch - 1 - i, C block (i + 1) % batch.
    const int a_of[batch] = {1, 0, 0};
    std::vector<const void*> a_ptrs, b_ptrs;
    std::vector<void*> c_ptrs;
    for (int i = 0; i < batch; ++i) {
      a_ptrs.push_back(dA + a_of[i] * a_size * e);
      b_ptrs.push_back(dB + (batch - 1 - i) * b_size * e);
      c_ptrs.push_back(dC + ((i + 1) % batch) * c_size * e);
    }
    void** arrays;
    expect_ok(cudaMalloc(&arrays, 3 * batch * sizeof(void*)), "cudaMalloc");
    cudaStream_t stream;
    expect_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    expect_ok(cudaMemcpyAsync(dA, A.bytes.data(), A.bytes.size(), cudaMemcpyHostToDevice, stream),
              "copy");
    expect_ok(cudaMemcpyAsync(dB, B.bytes.data(), B.bytes.size(), cudaMemcpyHostToDevice, stream),
              "copy");
    for (int which = 0; which < 3; ++which) {
      const void* src = which == 0 ? static_cast<const void*>(a_ptrs.data())
                        : which == 1 ? static_cast<const void*>(b_ptrs.data())
                                     : static_cast<const void*>(c_ptrs.data());
      expect_ok(cudaMemcpyAsync(arrays + which * batch, src, batch * sizeof(void*),
                                cudaMemcpyHostToDevice, stream),
                "copy");
    }
    cublasHandle_t handle;
    expect_ok(cublasCreate(&handle), "cublasCreate");
    expect_ok(cublasSetStream(handle, stream), "cublasSetStream");
    const float alpha = 1.0f, beta = 0.0f;
    expect_ok(cublasGemmBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha,
                                  const_cast<const void* const*>(arrays), type, lda,
                                  const_cast<const void* const*>(arrays + batch), type, ldb, &beta,
                                  arrays + 2 * batch, type, ldc, batch, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
              "cublasGemmBatchedEx");
    HostMatrix out(type, C.values.size());
    expect_ok(
        cudaMemcpyAsync(out.bytes.data(), dC, out.bytes.size(), cudaMemcpyDeviceToHost, stream),
        "copy");
    expect_ok(cudaStreamSynchronize(stream), "sync");
    for (int i = 0; i < batch; ++i)
      for (int c = 0; c < n; ++c)
        for (int r = 0; r < m; ++r) {
          double want = 0;
          for (int x = 0; x < k; ++x)
            want += double(A.values[a_of[i] * a_size + size_t(x) * lda + r]) *
                    B.values[(batch - 1 - i) * b_size + size_t(c) * ldb + x];
          const double got = out.from_bytes(((i + 1) % batch) * c_size + size_t(c) * ldc + r);
          ASSERT_NEAR(got, want, tolerance(type, k) * (1 + std::abs(want)))
              << "GEMM " << i << " C[" << r << ", " << c << "]";
        }
    expect_ok(cublasDestroy(handle), "cublasDestroy");
    expect_ok(cudaStreamDestroy(stream), "stream");
    cudaFree(arrays);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
  }
}

// A small f32 GemmEx on the legacy stream (no cublasSetStream): C = A . B.
struct Small {
  static constexpr int m = 3, n = 4, k = 2;
  float *a, *b, *c;
  Small() {
    cudaMalloc(&a, sizeof(float) * m * k);
    cudaMalloc(&b, sizeof(float) * k * n);
    cudaMalloc(&c, sizeof(float) * m * n);
  }
  ~Small() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
  }
  void upload(const std::vector<float>& ha, const std::vector<float>& hb, const std::vector<float>& hc) {
    cudaMemcpy(a, ha.data(), sizeof(float) * ha.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), sizeof(float) * hb.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(c, hc.data(), sizeof(float) * hc.size(), cudaMemcpyHostToDevice);
    // A copy from pageable memory may land after cudaMemcpy returns, and non-blocking streams
    // do not wait for the legacy stream: settle it before another stream reads.
    cudaDeviceSynchronize();
  }
  std::vector<float> result() {
    std::vector<float> out(m * n);
    cudaMemcpy(out.data(), c, sizeof(float) * out.size(), cudaMemcpyDeviceToHost);
    return out;
  }
  static std::vector<float> product(const std::vector<float>& ha, const std::vector<float>& hb) {
    std::vector<float> out(m * n, 0.0f);
    for (int col = 0; col < n; ++col)
      for (int r = 0; r < m; ++r)
        for (int x = 0; x < k; ++x) out[col * m + r] += ha[x * m + r] * hb[col * k + x];
    return out;
  }
};

TEST(CublasGemmEx, BetaZeroIgnoresNaNsInC) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  Small s;
  const std::vector<float> a{1, 2, 3, 4, 5, 6}, b{1, 0, 0, 1, 1, 1, 2, -1};
  s.upload(a, b, std::vector<float>(12, std::numeric_limits<float>::quiet_NaN()));
  cublasHandle_t handle;
  expect_ok(cublasCreate(&handle), "cublasCreate");
  const float one = 1.0f, zero = 0.0f;
  expect_ok(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, s.m, s.n, s.k, &one, s.a, CUDA_R_32F, s.m,
                         s.b, CUDA_R_32F, s.k, &zero, s.c, CUDA_R_32F, s.m, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
  EXPECT_EQ(s.result(), Small::product(a, b));
  cublasDestroy(handle);
}

// CUBLAS_COMPUTE_32F_FAST_TF32 multiplies f32 inputs as TF32 (10 mantissa bits), as the tensor
// cores take them; CUBLAS_COMPUTE_32F keeps them. 1 + 2^-12 is an f32 that TF32 rounds to 1
// (below half of its 2^-10 step), 1 + 3 * 2^-11 one it rounds to even, up to 1 + 2^-9. A GPU
// may keep f32 for a GEMM this small ("allows" down-conversion), so it checks only the bound.
TEST(CublasGemmEx, FastTf32RoundsF32InputsToTf32) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const float below_half = 1.0f + 0x1p-12f, tie = 1.0f + 3 * 0x1p-11f;
  const std::vector<float> a{below_half, tie}, b{1.0f, 1.0f};  // A 2 x 1, B 1 x 1: C = A
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  expect_ok(cudaMalloc(&da, 2 * sizeof(float)), "cudaMalloc");
  expect_ok(cudaMalloc(&db, sizeof(float)), "cudaMalloc");
  expect_ok(cudaMalloc(&dc, 2 * sizeof(float)), "cudaMalloc");
  expect_ok(cudaMemcpy(da, a.data(), 2 * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  expect_ok(cudaMemcpy(db, b.data(), sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  cublasHandle_t handle;
  expect_ok(cublasCreate(&handle), "cublasCreate");
  const float one = 1.0f, zero = 0.0f;
  auto product = [&](cublasComputeType_t compute) {
    expect_ok(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 1, 1, &one, da, CUDA_R_32F, 2, db,
                           CUDA_R_32F, 1, &zero, dc, CUDA_R_32F, 2, compute, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
    std::vector<float> c(2);
    expect_ok(cudaMemcpy(c.data(), dc, 2 * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return c;
  };
  EXPECT_EQ(product(CUBLAS_COMPUTE_32F), a);
  const std::vector<float> tf32 = product(CUBLAS_COMPUTE_32F_FAST_TF32);
  if (kOnEmulatedDevice) {
    EXPECT_EQ(tf32, (std::vector<float>{1.0f, 1.0f + 0x1p-9f}));
  } else {
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(tf32[i], a[i], 0x1p-10f) << i;
  }
  cublasDestroy(handle);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

TEST(CublasGemmEx, ZeroDepthScalesCByBeta) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  Small s;
  std::vector<float> c(12);
  for (int i = 0; i < 12; ++i) c[i] = float(i);
  s.upload(std::vector<float>(6, 1.0f), std::vector<float>(8, 1.0f), c);
  cublasHandle_t handle;
  expect_ok(cublasCreate(&handle), "cublasCreate");
  const float one = 1.0f, two = 2.0f;
  expect_ok(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, s.m, s.n, /*k=*/0, &one, s.a, CUDA_R_32F,
                         s.m, s.b, CUDA_R_32F, 1, &two, s.c, CUDA_R_32F, s.m, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
  for (int i = 0; i < 12; ++i) c[i] *= 2;
  EXPECT_EQ(s.result(), c);
  cublasDestroy(handle);
}

TEST(CublasGemmEx, RejectsALeadingDimensionShorterThanTheRowsAndLeavesCAlone) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  Small s;
  const std::vector<float> c(12, 3.0f);
  s.upload(std::vector<float>(6, 1.0f), std::vector<float>(8, 1.0f), c);
  cublasHandle_t handle;
  expect_ok(cublasCreate(&handle), "cublasCreate");
  const float one = 1.0f, zero = 0.0f;
  EXPECT_EQ(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, s.m, s.n, s.k, &one, s.a, CUDA_R_32F,
                         s.m - 1, s.b, CUDA_R_32F, s.k, &zero, s.c, CUDA_R_32F, s.m,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, s.m, s.n, s.k, &one, s.a, CUDA_R_32F,
                         s.m, s.b, CUDA_R_32F, s.k, &zero, s.c, CUDA_R_32F, s.m - 1,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  expect_ok(cudaDeviceSynchronize(), "sync");
  EXPECT_EQ(s.result(), c);
  cublasDestroy(handle);
}

// A GEMM captured into a graph reads its operands when the graph runs: new inputs, new result.
TEST(CublasGemmEx, CapturedIntoAGraphReplaysOnNewInputs) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  Small s;
  std::vector<float> a{1, 2, 3, 4, 5, 6}, b{1, 0, 0, 1, 1, 1, 2, -1};
  s.upload(a, b, std::vector<float>(12, 0.0f));
  cudaStream_t stream;
  expect_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cublasHandle_t handle;
  expect_ok(cublasCreate(&handle), "cublasCreate");
  expect_ok(cublasSetStream(handle, stream), "cublasSetStream");
  const float one = 1.0f, zero = 0.0f;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  expect_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  expect_ok(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, s.m, s.n, s.k, &one, s.a, CUDA_R_32F, s.m,
                         s.b, CUDA_R_32F, s.k, &zero, s.c, CUDA_R_32F, s.m, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
  expect_ok(cudaStreamEndCapture(stream, &graph), "end capture");
  expect_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  expect_ok(cudaStreamSynchronize(stream), "sync");
  EXPECT_EQ(s.result(), std::vector<float>(12, 0.0f)) << "a captured GEMM must not run";
  for (int round = 0; round < 2; ++round) {
    for (float& x : a) x += 1.0f;
    s.upload(a, b, std::vector<float>(12, 0.0f));
    expect_ok(cudaGraphLaunch(exec, stream), "launch");
    expect_ok(cudaStreamSynchronize(stream), "sync");
    EXPECT_EQ(s.result(), Small::product(a, b)) << "replay " << round;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cublasDestroy(handle);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace pmoe::testing
