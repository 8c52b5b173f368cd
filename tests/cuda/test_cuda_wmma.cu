// The warp matrix functions (nvcuda::wmma, <mma.h>) that pmoe's grouped GEMM runs on: one warp
// per block multiplies 16-bit fragments at each shape CUDA has for them (m16n16k16, m32n8k16,
// m8n32k16), bf16 and f16, A and B row- or column-major, C loaded from memory or filled, against
// a plain loop. The inputs are small integers and C is about 256, so every sum is exact in f32
// whatever its order (a GPU's tensor cores add in an order of their own) and the results must
// match bit for bit, while an accumulator of 16-bit floats would round them (bf16 holds 8 bits).
// On the emulated device also: a misaligned pointer or stride fails the launch, and a lane that
// skips the mma leaves its share of D unset (the fragment is the warp's, not the lane's).
// Built for the emulated device and for a GPU (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "cuda/cuda_test_flavor.hpp"
#include "cuda/launch.cuh"

namespace pmoe::testing {
namespace {

namespace wmma = nvcuda::wmma;

// D [M, N] f32 row-major = A [M, K] . B [K, N] + C. A and B in the given layouts, leading
// dimensions lda, ldb; C from memory (ldm N) unless fill, then `fill` everywhere. With
// skip_lane >= 0, that lane does not take part in the mma (it stores what its fragment held).
template <int M, int N, int K, typename T, typename LA, typename LB>
__global__ void multiply(const T* A, int lda, const T* B, int ldb, const float* C, bool fill,
                         float fill_value, float* D, int skip_lane) {
  wmma::fragment<wmma::matrix_a, M, N, K, T, LA> a;
  wmma::fragment<wmma::matrix_b, M, N, K, T, LB> b;
  wmma::fragment<wmma::accumulator, M, N, K, float> c;
  wmma::load_matrix_sync(a, A, lda);
  wmma::load_matrix_sync(b, B, ldb);
  if (fill)
    wmma::fill_fragment(c, fill_value);
  else
    wmma::load_matrix_sync(c, C, N, wmma::mem_row_major);
  if (int(threadIdx.x) != skip_lane) wmma::mma_sync(c, a, b, c);
  wmma::store_matrix_sync(D, c, N, wmma::mem_row_major);
}

float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
float to_f(__half v) { return __half2float(v); }
template <typename T>
T from_f(float v);
template <>
__nv_bfloat16 from_f(float v) { return __float2bfloat16_rn(v); }
template <>
__half from_f(float v) { return __float2half_rn(v); }

template <typename T>
struct DeviceArray {
  explicit DeviceArray(size_t n) : n(n) { EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess); }
  ~DeviceArray() { (void)cudaFree(p); }
  void put(const std::vector<T>& v) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> get() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  size_t n;
  T* p = nullptr;
};

// Runs one shape and layout pair; returns D and the loop's expectation.
template <int M, int N, int K, typename T, typename LA, typename LB>
std::pair<std::vector<float>, std::vector<float>> run(bool fill, int skip_lane = -1,
                                                      cudaError_t* status = nullptr,
                                                      int a_offset = 0) {
  constexpr bool a_row = std::is_same_v<LA, wmma::row_major>;
  constexpr bool b_row = std::is_same_v<LB, wmma::row_major>;
  const int lda = (a_row ? K : M) + 8, ldb = (b_row ? N : K) + 16;  // padded: ldm is honoured
  std::vector<T> A(size_t(lda) * (a_row ? M : K) + 64), B(size_t(ldb) * (b_row ? K : N));
  const size_t cells = size_t(M) * N;
  std::vector<float> C(cells), want(cells);
  auto a_at = [&](int r, int k) -> T& { return A[a_row ? size_t(r) * lda + k : size_t(k) * lda + r]; };
  auto b_at = [&](int k, int c) -> T& { return B[b_row ? size_t(k) * ldb + c : size_t(c) * ldb + k]; };
  for (size_t i = 0; i < A.size(); ++i) A[i] = from_f<T>(99.0f);  // padding: never read
  for (size_t i = 0; i < B.size(); ++i) B[i] = from_f<T>(99.0f);
  for (int r = 0; r < M; ++r)
    for (int k = 0; k < K; ++k) a_at(r, k) = from_f<T>(float((r * 7 + k * 3) % 9 - 4));
  for (int k = 0; k < K; ++k)
    for (int c = 0; c < N; ++c) b_at(k, c) = from_f<T>(float((k * 5 + c * 11) % 7 - 3));
  const float fill_value = 257.0f;
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) {
      C[size_t(r) * N + c] = float(256 + (r + 2 * c) % 5);
      float sum = fill ? fill_value : C[size_t(r) * N + c];
      for (int k = 0; k < K; ++k) sum += to_f(a_at(r, k)) * to_f(b_at(k, c));
      want[size_t(r) * N + c] = sum;
    }
  DeviceArray<T> a(A.size()), b(B.size());
  DeviceArray<float> c(C.size()), d(C.size());
  a.put(A);
  b.put(B);
  c.put(C);
  const std::vector<float> sentinel(C.size(), -1000.0f);
  d.put(sentinel);
  cuda::launch_shaped(multiply<M, N, K, T, LA, LB>, dim3(1), dim3(32), cudaStream_t{}, a.p + a_offset,
                      lda, b.p, ldb, c.p, fill, fill_value, d.p, skip_lane);
  const cudaError_t s = cudaStreamSynchronize(cudaStream_t{});  // with the kernel's status
  if (status) *status = s;
  else EXPECT_EQ(s, cudaSuccess) << cudaGetErrorString(s);
  return {d.get(), want};
}

template <int M, int N, int K, typename T>
void expect_shape(const char* name) {
  for (bool fill : {false, true}) {
    const std::string where = std::string(name) + (fill ? " filled C" : " loaded C");
    auto [got, want] = run<M, N, K, T, wmma::row_major, wmma::row_major>(fill);
    EXPECT_EQ(got, want) << where << ", A and B row-major";
    std::tie(got, want) = run<M, N, K, T, wmma::col_major, wmma::row_major>(fill);
    EXPECT_EQ(got, want) << where << ", A column-major";
    std::tie(got, want) = run<M, N, K, T, wmma::row_major, wmma::col_major>(fill);
    EXPECT_EQ(got, want) << where << ", B column-major";
  }
}

TEST(Wmma, Bf16FragmentsAtEveryShapeMatchALoop) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  expect_shape<16, 16, 16, __nv_bfloat16>("bf16 m16n16k16");
  expect_shape<32, 8, 16, __nv_bfloat16>("bf16 m32n8k16");
  expect_shape<8, 32, 16, __nv_bfloat16>("bf16 m8n32k16");
}

TEST(Wmma, F16FragmentsAtEveryShapeMatchALoop) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  expect_shape<16, 16, 16, __half>("f16 m16n16k16");
  expect_shape<32, 8, 16, __half>("f16 m32n8k16");
  expect_shape<8, 32, 16, __half>("f16 m8n32k16");
}

// The emulated device holds kernels to the contract where a GPU would fault or give garbage.
TEST(WmmaEmulated, MisalignedPointerFailsTheLaunch) {
  if (!kOnEmulatedDevice) GTEST_SKIP() << "a GPU faults, or reads wrong data";
  cudaError_t status = cudaSuccess;
  (void)run<8, 32, 16, __nv_bfloat16, wmma::row_major, wmma::row_major>(false, -1, &status,
                                                                        /*a_offset=*/8);
  EXPECT_NE(status, cudaSuccess) << "A 16 bytes past a 32-byte boundary was accepted";
  (void)cudaGetLastError();
}

TEST(WmmaEmulated, ALaneThatSkipsTheMmaLeavesItsShareUnset) {
  if (!kOnEmulatedDevice) GTEST_SKIP() << "a GPU's result is undefined there";
  auto [got, want] = run<8, 32, 16, __nv_bfloat16, wmma::row_major, wmma::row_major>(false, 5);
  int wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != want[i];
  EXPECT_EQ(wrong, 8 * 32 / 32) << "lane 5's share is its accumulator's elements, one in 32";
}

}  // namespace
}  // namespace pmoe::testing
