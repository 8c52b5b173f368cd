// Real MoE layer shapes that `pmoe-bench moe --preset` runs and the expert stage's model
// (`pmoe-bench model expert-stage`) prices, and each expert's rows as pmoe's router routes a
// preset's batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "expert_stage_model.hpp"
#include "pmoe/moe.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe::bench {

// feature = the hidden size, ffn = the expert's intermediate size; all swiglu. `batch` fits this
// machine and gives each expert enough rows for BLAS. tools/torch_grouped_mm.py has the same.
struct MoePreset {
  const char* name;
  int feature, ffn, experts, top_k, batch;
  const char* note;
};
const std::vector<MoePreset>& moe_presets();
const MoePreset& find_moe_preset(const std::string& name);  // throws pmoe::Error naming the known

// The preset's layer config (swiglu, `dtype`, seed 1: pmoe-bench moe's defaults).
MoeConfig preset_config(const MoePreset& p, DType dtype);

// Each expert's rows when the layer's router routes x: the CPU Router, which picks as the
// device's does (the same f32 logits up to summation order, ties to the lower expert), so
// torch's baseline and the model get the groups pmoe's expert stage gets, not an even split.
std::vector<int64_t> routed_group_sizes(const MoeConfig& c, const Tensor& x);

// One rank's expert stage at the preset's widths for `batch` tokens (expert_stage_model.hpp):
// the groups pmoe's router makes of a bf16 batch (the input pmoe-bench moe routes), or with
// `routed` false an even split.
ExpertStageShape preset_expert_stage(const MoePreset& p, int batch, bool routed);

}  // namespace pmoe::bench
