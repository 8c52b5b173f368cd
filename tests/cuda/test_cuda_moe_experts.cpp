// The MoE layers' expert GEMMs on one CUDA device, 1 or 2 thread ranks sharing it: the tiles'
// padding under Zipf routing at the DeepSeek-V3 and Mixtral presets (the host's plan, no device);
// the rows in use, live tiles and rows issued the device counts with device_stats (and nothing
// without); TF32 as an f32 layer's option; bf16 weights kept in bf16.
// Built for the emulated device and for a GPU (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

// After the standard headers: the emulated device's defines qualifiers such as __noinline__.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cpu/gemm.hpp"
#include "cuda/cuda_moe_test_helpers.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "cuda/gemm/expert_tiles.hpp"
#include "moe_cases.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::testing {
namespace {

// The expert GEMMs' padding under skewed routing (src/cuda/gemm/expert_tiles.hpp), at pmoe-bench's
// DeepSeek-V3 (32 experts, top-8) and Mixtral (8, top-2) presets: tokens pick k distinct experts
// with Zipf 1.2 weights (expert 0 the hottest), on W ranks with 128, 512 or 2048 tokens each.
// W = 1 is SimpleMoe (and each TpMoe rank: the same rows); W > 1 is EpMoe (one micro-batch).
// Wherever a rank has 1024 rows in use or more, the live tiles cover at most 1.15 x those rows.
// The batch the host launches for cuBLAS (f32 layers) is sized from a bound: for the local layers
// the rows in use, so Mixtral's stays within 1.15 too, while DeepSeek-V3's 32 experts at the
// 8-row tile floor add up to 256 rows (1.25 x at 128 tokens); for EpMoe the most a rank can
// receive, R min(k, E_local), far above what it gets. bf16 layers issue the live tiles only, as
// the grouped GEMM counts them on the device (test_cuda_grouped_gemm.cu).
TEST(MoeCudaTiles, PaddingUnderZipfRoutingAtThePresets) {
  struct Preset {
    const char* name;
    int experts, top_k;
    std::vector<int> worlds;
  };
  const Preset presets[] = {{"deepseek-v3", 32, 8, {1, 2, 4, 8, 16, 32}},
                            {"mixtral-8x7b", 8, 2, {1, 2, 4, 8}}};
  std::mt19937 rng(12);
  int checked = 0;
  for (const Preset& p : presets) {
    for (int W : p.worlds)
      for (int m : {128, 512, 2048}) {
        const int L = p.experts / W;
        const std::vector<int32_t> counts =
            zipf_expert_counts(p.experts, p.top_k, W * m, 1.2, rng);
        for (int r = 0; r < W; ++r) {
          const int32_t* mine = counts.data() + r * L;
          int64_t used = 0;
          for (int e = 0; e < L; ++e) used += mine[e];
          const int64_t R = int64_t(W) * m;
          const detail::ExpertTiles plan =
              W == 1 ? detail::plan_expert_tiles(L, m, int64_t(m) * p.top_k, int64_t(m) * p.top_k)
                     : detail::plan_expert_tiles(L, R, R * std::min(p.top_k, L),
                                                 R * p.top_k / W);
          const int64_t live = detail::live_tile_rows(mine, L, plan.tile);
          const std::string where = detail::cat(p.name, " W ", W, " m ", m, " rank ", r, ": ",
                                                used, " rows in use, tile ", plan.tile);
          EXPECT_GE(live, used) << where;
          EXPECT_GE(plan.rows(), live) << where;
          if (used < 1024) continue;
          ++checked;
          EXPECT_LE(double(live), 1.15 * double(used)) << where << ", live tiles " << live;
          if (W == 1 && p.experts == 8) {
            EXPECT_LE(double(plan.rows()), 1.15 * double(used)) << where << ", issued " << plan.rows();
          }
          if (W == 1) {
            EXPECT_LE(plan.rows(), used + L * plan.tile) << where;
          }
        }
      }
  }
  EXPECT_GT(checked, 50);
}

// What the device counts with MoeConfig::device_stats: the rows in use equal the CPU's (which
// computes exactly those), the live tiles' rows lie between them and the rows issued, and for
// SimpleMoe equal the host's rule over the CPU router's counts; a bf16 layer's grouped GEMM
// issues exactly the live tiles' rows. Without device_stats, nothing.
TEST(MoeCudaTiles, DeviceCountsRowsInUseAndLiveTilesOnlyWhenAsked) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  cpu::set_blas_threads(1);
  for (MoeVariant v : {MoeVariant::simple, MoeVariant::tp, MoeVariant::ep})
    for (bool asked : {false, true}) {
      const int W = v == MoeVariant::simple ? 1 : 2;
      MoeCase c;
      c.config = make_moe_config(16, 16, 8, 2, Activation::relu, DType::bf16);
      c.config.device_stats = asked;
      c.variant = v;
      c.batch = 96;
      c.micro_batches = v == MoeVariant::ep ? 2 : 1;
      const auto device = expect_case(c, W, Device::cuda(0));
      const auto cpu = expect_case(c, W, Device::cpu());
      for (int r = 0; r < W; ++r) {
        const MoeStats& d = device[size_t(r)].stats;
        const std::string where = detail::cat(describe(c, W), " rank ", r);
        if (!asked) {
          EXPECT_EQ(d.expert_rows_used, 0) << where;
          EXPECT_EQ(d.expert_rows_live, 0) << where;
          if (v == MoeVariant::ep) {
            EXPECT_EQ(d.bytes_moved, 0) << where;  // counted on the device (TpMoe's: the host's)
          }
          EXPECT_EQ(d.experts_s, 0.0) << where;
          continue;
        }
        EXPECT_EQ(d.expert_rows_used, cpu[size_t(r)].stats.expert_rows) << where;
        EXPECT_GT(d.expert_rows_used, 0) << where;
        EXPECT_GE(d.expert_rows_live, d.expert_rows_used) << where;
        EXPECT_GE(d.expert_rows, d.expert_rows_live) << where;
        EXPECT_GT(d.experts_s, 0.0) << where;
      }
      if (v != MoeVariant::simple || !asked) continue;
      // The host's rule over the CPU router's counts.
      const Buffer x = reference::make_moe_input(c.config, c.batch, c.input_seed);
      Router router(c.config);
      Buffer indices(DType::i32, {c.batch, 2}), weights(DType::f32, {c.batch, 2});
      router.route(x, indices, weights);
      std::vector<int32_t> counts(8, 0);
      for (int i = 0; i < c.batch * 2; ++i) ++counts[size_t(indices.data<int32_t>()[i])];
      const auto plan = detail::plan_expert_tiles(8, c.batch, 2 * c.batch, 2 * c.batch);
      EXPECT_EQ(device[0].stats.expert_rows_live, detail::live_tile_rows(counts.data(), 8, plan.tile));
      // bf16: the grouped GEMM computes the live tiles, no more (the batch bound is plan.rows()).
      EXPECT_EQ(device[0].stats.expert_rows, device[0].stats.expert_rows_live);
      EXPECT_LT(device[0].stats.expert_rows, plan.rows());
    }
}

// An f32 layer with MoeConfig::tf32 multiplies its experts' inputs as TF32: its output differs
// from the f32 layer's, and matches the reference within TF32's rounding (2^-11 relative per
// input, two GEMMs deep: 2^-8 of the magnitude of a sum's terms leaves room), where the f32
// layer holds the f32 tolerance (1e-5). A bf16 layer cannot ask for it.
TEST(MoeCudaGemm, Tf32IsAnF32LayersOptionAndRoundsTheInputs) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  cpu::set_blas_threads(1);
  MoeConfig cfg = make_moe_config(24, 36, 4, 2, Activation::gelu, DType::f32);
  const int m = 16, H = cfg.hidden_dim, O = cfg.out_dim();
  const Buffer x = reference::make_moe_input(cfg, m, 5);
  const auto expected = reference::reference_moe(cfg, x, reference::all_rows(m));
  auto run = [&](const MoeConfig& c) {
    SimpleMoe layer(c, m, Device::cuda(0));
    Buffer x_device(DType::f32, {m, H}, Device::cuda(0)), y_device(DType::f32, {m, O}, Device::cuda(0));
    Buffer y(DType::f32, {m, O});
    copy(x_device, x);
    layer.forward(x_device, y_device);
    synchronize(Stream());
    copy(y, y_device);
    return y;
  };
  const Buffer f32 = run(cfg);
  cfg.tf32 = true;
  const Buffer tf32 = run(cfg);
  EXPECT_EQ(reference::compare_moe(cfg, expected, f32, 0, reference::moe_tolerance(DType::f32)).error,
            "");
  const auto cmp = reference::compare_moe(cfg, expected, tf32, 0, 0x1p-8);
  EXPECT_EQ(cmp.error, "");
  EXPECT_GT(cmp.compared, 0);
  int differs = 0;
  for (int i = 0; i < m * O; ++i) differs += f32.data<float>()[i] != tf32.data<float>()[i];
  EXPECT_GT(differs, 0) << "tf32 gave the f32 layer's bits: its inputs were not rounded";
  MoeConfig bad = cfg;
  bad.dtype = DType::bf16;
  try {
    bad.validate();
    ADD_FAILURE() << "a bf16 layer with tf32 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MoeConfig: tf32 applies to f32 layers"),
              std::string::npos)
        << e.what();
  }
}

// A bf16 layer keeps its experts' weights in bf16 on the device (half the f32 bytes), the router
// in f32: H E 4 + (E H 2F + E F O) 2 bytes for swiglu.
TEST(MoeCudaGemm, Bf16WeightsAreStoredInBf16) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const MoeConfig cfg = make_moe_config(24, 36, 4, 2, Activation::swiglu, DType::bf16, 16);
  SimpleMoe layer(cfg, 8, Device::cuda(0));
  const size_t H = 24, F = 36, E = 4, O = 16;
  EXPECT_EQ(layer.weight_bytes(), H * E * 4 + (E * H * 2 * F + E * F * O) * 2);
}

}  // namespace
}  // namespace pmoe::testing
