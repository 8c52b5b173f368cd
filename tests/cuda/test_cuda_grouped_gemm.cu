// pmoe's grouped expert GEMM on tensor cores (src/cuda/moe/grouped_gemm.cuh) on one device, one
// stream: against a plain loop at tile sizes from 5 to 128 rows and odd n and k, computing the
// live tiles only (the entries past them address memory that must stay untouched) and counting
// the rows it issued; then DeviceExperts (device_experts.hpp) on the per-expert row counts of
// Zipf 1.2 routing at the DeepSeek-V3 and Mixtral presets, where the rows issued must follow the
// counts. Built for the emulated device and for a GPU (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_test_flavor.hpp"
#include "cuda/moe/device_experts.hpp"
#include "cuda/moe/expert_tiles.hpp"
#include "cuda/moe/grouped_gemm.cuh"
#include "moe_cases.hpp"
#include "pmoe/error.hpp"

namespace pmoe::testing {
namespace {

template <typename T>
T* device_copy(const std::vector<T>& v) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, v.size()) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}
template <typename T>
std::vector<T> host_copy(const T* p, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// `live` tiles of T rows over `groups` weight matrices, in a batch of live + 3 entries; the
// entries past the live ones address a dead region of C that must keep its sentinel. Inputs are
// small integers, so the f32 sums are exact in any order and the results must equal the loop's.
void expect_live_tiles(int T, int n, int k, int live, int groups) {
  const std::string where = detail::cat("T ", T, " n ", n, " k ", k, " live ", live);
  const int lda = k + 3, ldb = n + 5, ldc = n + 1, tiles = live + 3;
  const int64_t rows = int64_t(tiles) * T;
  std::vector<__nv_bfloat16> A(size_t(rows) * lda), B(size_t(groups) * k * ldb);
  for (size_t i = 0; i < A.size(); ++i) A[i] = __float2bfloat16_rn(float(int(i * 7 % 11) - 5));
  for (size_t i = 0; i < B.size(); ++i) B[i] = __float2bfloat16_rn(float(int(i * 5 % 7) - 3));
  const float kSentinel = -12345.0f;
  std::vector<float> C(size_t(rows) * ldc, kSentinel);
  __nv_bfloat16* a = device_copy(A);
  __nv_bfloat16* b = device_copy(B);
  float* c = device_copy(C);
  std::vector<const void*> a_tiles, b_tiles;
  std::vector<void*> c_tiles;
  for (int t = 0; t < tiles; ++t) {
    // The dead entries address the last tiles' rows, as real dead tiles address scratch rows.
    a_tiles.push_back(a + int64_t(t) * T * lda);
    b_tiles.push_back(b + int64_t(t % groups) * k * ldb);
    c_tiles.push_back(c + int64_t(t) * T * ldc);
  }
  const void** a_dev = device_copy(a_tiles);
  const void** b_dev = device_copy(b_tiles);
  void** c_dev = device_copy(c_tiles);
  int32_t* live_dev = device_copy(std::vector<int32_t>{live});
  const int blocks = 3;
  int64_t* issued = device_copy(std::vector<int64_t>(blocks, -1));
  cuda::GroupedGemm g;
  g.a = a_dev;
  g.b = b_dev;
  g.c = c_dev;
  g.live_tiles = live_dev;
  g.max_tiles = tiles;
  g.tile_rows = T;
  g.n = n;
  g.k = k;
  g.lda = lda;
  g.ldb = ldb;
  g.ldc = ldc;
  g.issued = issued;
  cuda::launch_grouped_gemm(g, DType::bf16, blocks, cudaStream_t{});
  ASSERT_EQ(cudaStreamSynchronize(cudaStream_t{}), cudaSuccess) << where;
  const std::vector<float> got = host_copy(c, C.size());
  int wrong = 0, touched = 0;
  for (int t = 0; t < tiles; ++t)
    for (int r = 0; r < T; ++r)
      for (int col = 0; col < ldc; ++col) {
        const int64_t row = int64_t(t) * T + r;
        const float v = got[size_t(row * ldc + col)];
        if (t >= live || col >= n) {
          touched += v != kSentinel;
          continue;
        }
        float sum = 0;
        for (int i = 0; i < k; ++i)
          sum += __bfloat162float(A[size_t(row * lda + i)]) *
                 __bfloat162float(B[size_t((int64_t(t % groups) * k + i) * ldb + col)]);
        wrong += v != sum;
      }
  EXPECT_EQ(wrong, 0) << where;
  EXPECT_EQ(touched, 0) << where << ": written past the live tiles or past n";
  int64_t issued_rows = 0;
  for (int64_t v : host_copy(issued, blocks)) issued_rows += v;
  EXPECT_EQ(issued_rows, int64_t(live) * ((T + 7) / 8 * 8)) << where;  // whole fragments
  for (void* p : {(void*)a, (void*)b, (void*)c, (void*)a_dev, (void*)b_dev, (void*)c_dev,
                  (void*)live_dev, (void*)issued})
    (void)cudaFree(p);
}

TEST(GroupedGemm, ComputesTheLiveTilesOnlyAndCountsTheirRows) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  // T: the 8-row floor, a tile cut to a small capacity (5), 16, one not a multiple of 8, the
  // largest; n and k around the block's columns and the staged k chunk.
  expect_live_tiles(8, 300, 40, 5, 2);
  expect_live_tiles(5, 33, 7, 4, 3);
  expect_live_tiles(16, 129, 16, 3, 2);
  expect_live_tiles(24, 65, 33, 2, 1);
  expect_live_tiles(128, 40, 20, 2, 2);
  expect_live_tiles(8, 8, 8, 0, 1);  // no live tile: nothing computed, 0 rows counted
}

TEST(GroupedGemm, RejectsWhatItHasNoKernelFor) {
  cuda::GroupedGemm g;
  g.tile_rows = 8;
  g.max_tiles = 1;
  try {
    cuda::launch_grouped_gemm(g, DType::f32, 1, cudaStream_t{});
    ADD_FAILURE() << "f32 inputs were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor-core kernel for f32"), std::string::npos)
        << e.what();
  }
  g.tile_rows = 129;
  try {
    cuda::launch_grouped_gemm(g, DType::bf16, 1, cudaStream_t{});
    ADD_FAILURE() << "129-row tiles were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tiles of 129 rows"), std::string::npos) << e.what();
  }
}

// Issue 32's bound, on the device: tokens pick k distinct experts with Zipf 1.2 weights (expert
// 0 the hottest) on W ranks of 128 to 2048 tokens; each rank's experts run as EpMoe runs
// them (W > 1: groups of R = W m slots, planned for R min(k, E_local) rows, about R k / W
// expected) or as SimpleMoe does (W = 1: groups of m). Wherever a rank has 1024 rows in use or
// more, the rows the GEMMs issued, as the kernel counted them, stay within 1.15 of those rows;
// everywhere they equal the live tiles' rows (never the batch bound, up to 14 x the rows in use
// on a cold rank). Small H and F: the count does not depend on them.
TEST(GroupedGemm, IssuedRowsFollowTheCountsUnderZipfRoutingAtThePresets) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  struct Preset {
    const char* name;
    int experts, top_k;
    std::vector<int> worlds, tokens;
  };
  // Sizes where some rank has about 1024 rows in use, or many more (kept few: each row runs).
  const Preset presets[] = {{"deepseek-v3", 32, 8, {1, 4, 16}, {128, 512}},
                            {"mixtral-8x7b", 8, 2, {1, 2, 8}, {512, 2048}}};
  const cudaStream_t stream{};  // the legacy stream: the copies and memsets above are on it
  std::mt19937 rng(12);
  int checked = 0;
  double worst = 0;
  for (const Preset& p : presets) {
    MoeConfig cfg = make_moe_config(8, 8, p.experts, p.top_k, Activation::relu, DType::bf16);
    cfg.device_stats = true;
    for (int W : p.worlds)
      for (int m : p.tokens) {
        const int L = p.experts / W;
        const std::vector<int32_t> counts =
            zipf_expert_counts(p.experts, p.top_k, W * m, 1.2, rng);
        const int64_t C = W == 1 ? m : int64_t(W) * m;
        const int64_t max_rows = W == 1 ? int64_t(m) * p.top_k : C * std::min(p.top_k, L);
        const int64_t expected = W == 1 ? max_rows : std::max<int64_t>(1, C * p.top_k / W);
        for (int r = 0; r < W; ++r) {
          const std::vector<int32_t> mine(counts.begin() + r * L, counts.begin() + (r + 1) * L);
          int64_t used = 0;
          for (int32_t v : mine) used += v;
          if (used < 1024 && r > 0) continue;  // rank 0 (the hottest) always runs
          cuda::DeviceExperts experts(cfg, r * L, L, 0, cfg.ffn_dim, max_rows, Device::cuda(0));
          const int H = cfg.feature_dim, F = cfg.ffn_dim, O = cfg.out_dim();
          Buffer x(DType::bf16, {L, C, H}, Device::cuda(0));
          Buffer hidden(DType::f32, {L, C, F}, Device::cuda(0)), out(DType::f32, {L, C, O}, Device::cuda(0));
          Buffer act(DType::bf16, {L, C, F}, Device::cuda(0));
          ASSERT_EQ(cudaMemset(x.data<void>(), 0, x.nbytes()), cudaSuccess);
          int32_t* counts_dev = device_copy(mine);
          experts.run(nullptr, stream, int(C), max_rows, expected, x.data<void>(), H,
                      hidden.data<float>(), act.data<void>(), out.data<float>(), counts_dev);
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          (void)cudaFree(counts_dev);
          const auto t = experts.tally(1);
          const auto plan = experts.tile_plan(C, max_rows, expected);
          const std::string where = detail::cat(p.name, " W ", W, " m ", m, " rank ", r, ": ",
                                                used, " rows in use, tile ", plan.tile, ", issued ",
                                                t.issued, ", batch bound ", plan.rows());
          EXPECT_EQ(t.used, used) << where;
          EXPECT_EQ(t.live, detail::live_tile_rows(mine.data(), L, plan.tile)) << where;
          EXPECT_EQ(t.issued, t.live) << where;
          if (used < 1024) continue;
          ++checked;
          worst = std::max(worst, double(t.issued) / double(used));
          EXPECT_LE(double(t.issued), 1.15 * double(used)) << where;
        }
      }
  }
  EXPECT_GT(checked, 20);
  std::printf("issued / used, worst over %d ranks with >= 1024 rows in use: %.4f\n", checked, worst);
}

}  // namespace
}  // namespace pmoe::testing
