// Host only, no ranks run: the expert stage's model (tools/pmoe-bench/expert_stage_model.hpp).
// A grouped GEMM worked out by hand (bound by its tiles' FLOPs, then by its operands' bytes),
// both stages' kernels in order with the tiles each side takes, shapes that are refused, and the
// target: at the Mixtral-8x7B and DeepSeek-V3 presets, batch 1024, with pmoe's router's groups,
// pmoe's expert stage at 0.8 of torch._grouped_mm's rate or better on an H100 and an H200. (The
// bytes it charges pmoe's kernels are held to the emulated device's counts in
// tests/cuda/test_cuda_moe_bytes.cpp.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "expert_stage_model.hpp"
#include "moe_presets.hpp"
#include "pmoe/error.hpp"

namespace pmoe::bench {
namespace {

constexpr double kTensorPerUs = 989e6;  // 989 TFLOP/s in FLOPs a µs
constexpr double kH200BytesPerUs = 4.8e6;

TEST(ExpertStageModel, AGroupedGemmByHand) {
  const GpuSpec& h200 = find_gpu("h200");
  // Groups of 200, 256, 0 and 600 rows in 128-row tiles: 256 + 256 + 0 + 640 = 1152 issued,
  // 1056 used, 3 experts' weights read.
  GroupedGemm g{{200, 256, 0, 600}, 4096, 4096, 128, 4};
  StageKernel k = predict_grouped_gemm(h200, "gemm", "by hand", g);
  const double flops = 2.0 * 1152 * 4096 * 4096;
  const double operands = 2.0 * (1056.0 * 4096 + 3.0 * 4096 * 4096);
  const double stored = 1056.0 * 4096 * 4;
  EXPECT_DOUBLE_EQ(k.issued_flops, flops);
  EXPECT_DOUBLE_EQ(k.bytes, operands + stored);
  // 38.7 GFLOP at 989 TFLOP/s: 39.1 µs, more than the operands' 109 MB at 4.8 TB/s (22.7 µs).
  EXPECT_NEAR(k.us, 2.0 + flops / kTensorPerUs + stored / kH200BytesPerUs, 1e-9);
  EXPECT_EQ(k.kernel, "gemm");
  // Few rows: the weights' bytes bound the mainloop, not the FLOPs.
  g.group_rows = {8, 8, 0, 8};
  k = predict_grouped_gemm(h200, "gemm", "", g);
  const double weights = 2.0 * (24.0 * 4096 + 3.0 * 4096 * 4096);
  EXPECT_NEAR(k.us, 2.0 + weights / kH200BytesPerUs + 24.0 * 4096 * 4 / kH200BytesPerUs, 1e-9);
  // The H100's HBM is slower: 3.35 TB/s.
  EXPECT_GT(predict_grouped_gemm(find_gpu("h100-sxm"), "gemm", "", g).us, k.us);
  EXPECT_THROW(predict_grouped_gemm(h200, "gemm", "", {{-1}, 64, 64, 128, 4}), Error);
  EXPECT_THROW(predict_grouped_gemm(h200, "gemm", "", {{1}, 64, 64, 128, 8}), Error);
}

TEST(ExpertStageModel, BothStagesKernelsInOrderWithTheirTiles) {
  const GpuSpec& h200 = find_gpu("h200");
  ExpertStageShape s;
  s.feature = 1024;
  s.ffn = 512;
  s.output = 1024;
  s.tokens = 64;
  s.top_k = 2;
  s.group_rows = {64, 64};  // 64 rows an expert: torch takes its 64-row tiles, pmoe 128
  const ExpertStagePrediction p = predict_expert_stage(h200, s);
  auto names = [](const StagePrediction& stage) {
    std::vector<std::string> out;
    for (const StageKernel& k : stage.kernels) out.push_back(k.kernel);
    return out;
  };
  EXPECT_EQ(names(p.pmoe),
            (std::vector<std::string>{"moe_group_pairs", "moe_gather_rows", "plan_groups",
                                      "library_grouped_gemm", "moe_activate",
                                      "library_grouped_gemm"}));
  EXPECT_EQ(names(p.torch),
            (std::vector<std::string>{"prepare_grouped_gemm_data", "grouped_mm", "silu", "mul",
                                      "prepare_grouped_gemm_data", "grouped_mm"}));
  double pmoe_sum = 0, torch_sum = 0;
  for (const StageKernel& k : p.pmoe.kernels) pmoe_sum += k.us;
  for (const StageKernel& k : p.torch.kernels) torch_sum += k.us;
  EXPECT_DOUBLE_EQ(p.pmoe.us, pmoe_sum);
  EXPECT_DOUBLE_EQ(p.torch.us, torch_sum);
  EXPECT_DOUBLE_EQ(p.ratio(), p.torch.us / p.pmoe.us);
  const double used = 2.0 * 128 * (1024.0 * 1024 + 512.0 * 1024);
  EXPECT_DOUBLE_EQ(p.pmoe.used_flops, used);
  EXPECT_DOUBLE_EQ(p.torch.used_flops, used);
  // GEMM 1 (n = 2F = 1024, k = H): pmoe issues 2 x 128 rows and stores f32, torch 2 x 64, bf16.
  EXPECT_DOUBLE_EQ(p.pmoe.kernels[3].issued_flops, 2.0 * 256 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(p.torch.kernels[1].issued_flops, 2.0 * 128 * 1024 * 1024);
  // The row kernels: gather reads and writes the 128 rows of H bf16; activate reads f32 [128, 2F]
  // and writes [128, F] bf16; torch's silu and mul move 2 and 3 bf16 [128, F] tensors.
  EXPECT_DOUBLE_EQ(p.pmoe.kernels[1].bytes, 2 * 128.0 * 1024 * 2);
  EXPECT_DOUBLE_EQ(p.pmoe.kernels[4].bytes, 128.0 * 1024 * 4 + 128.0 * 512 * 2);
  EXPECT_DOUBLE_EQ(p.torch.kernels[2].bytes, 2 * 128.0 * 512 * 2);
  EXPECT_DOUBLE_EQ(p.torch.kernels[3].bytes, 3 * 128.0 * 512 * 2);

  ExpertStageShape bad = s;
  bad.tokens = 65;  // 128 rows are not 65 x 2
  EXPECT_THROW(predict_expert_stage(h200, bad), Error);
  bad = s;
  bad.group_rows.clear();
  EXPECT_THROW(predict_expert_stage(h200, bad), Error);
}

// The target case of the expert stage: pmoe's stage at 0.8 of torch._grouped_mm's rate or
// better at both presets, batch 1024, the groups pmoe's router makes (what pmoe-bench moe gives
// both sides), on both GPUs, in the model.
TEST(ExpertStageModel, ThePresetsMeetTheirTargetInTheModel) {
  for (const char* name : {"mixtral-8x7b", "deepseek-v3"}) {
    const MoePreset& preset = find_moe_preset(name);
    const ExpertStageShape s = preset_expert_stage(preset, 1024, /*routed=*/true);
    ASSERT_EQ(int(s.group_rows.size()), preset.experts);
    for (const std::string& gpu : gpu_names()) {
      const ExpertStagePrediction p = predict_expert_stage(find_gpu(gpu), s);
      EXPECT_GE(p.ratio(), 0.8) << name << " on " << gpu << ": pmoe " << p.pmoe.us
                                << " µs, torch " << p.torch.us << " µs";
      EXPECT_LE(p.ratio(), 1.0) << name << " on " << gpu << ": the same GEMMs, pmoe's more bytes";
    }
  }
}

}  // namespace
}  // namespace pmoe::bench
