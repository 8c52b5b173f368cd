#include "moe_presets.hpp"

#include "pmoe/error.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::bench {

const std::vector<MoePreset>& moe_presets() {
  static const std::vector<MoePreset> all = {
      {"mixtral-8x7b", 4096, 14336, 8, 2, 256,
       "Mixtral 8x7B: all 8 experts (5.6 GB of f32 weights)"},
      {"deepseek-v3", 7168, 2048, 32, 8, 256,
       "DeepSeek-V3: 32 of its 256 routed experts, so the weights fit (5.6 GB of f32; all 256 are "
       "45 GB); H, F, top-8 and swiglu are the model's; its shared expert is left out"},
      {"qwen3-30b-a3b", 2048, 768, 128, 8, 512,
       "Qwen3-30B-A3B: all 128 experts (2.4 GB of f32 weights)"},
  };
  return all;
}

const MoePreset& find_moe_preset(const std::string& name) {
  std::string known;
  for (const MoePreset& p : moe_presets()) {
    if (name == p.name) return p;
    known += (known.empty() ? "" : ", ") + std::string(p.name);
  }
  throw Error(detail::cat("--preset '", name, "' is unknown: expected one of ", known));
}

MoeConfig preset_config(const MoePreset& p, DType dtype) {
  MoeConfig c;
  c.hidden_dim = p.feature;
  c.ffn_dim = p.ffn;
  c.num_experts = p.experts;
  c.top_k = p.top_k;
  c.act = Activation::swiglu;
  c.dtype = dtype;
  c.seed = 1;
  c.validate();
  return c;
}

std::vector<int64_t> routed_group_sizes(const MoeConfig& c, const Tensor& x) {
  const int m = int(x.size(0));
  Buffer indices(DType::i32, {m, c.top_k}), weights(DType::f32, {m, c.top_k});
  Router(c).route(x, indices, weights);
  std::vector<int64_t> sizes(size_t(c.num_experts), 0);
  const int32_t* picked = indices.data<int32_t>();
  for (int64_t i = 0; i < int64_t(m) * c.top_k; ++i) ++sizes[size_t(picked[i])];
  return sizes;
}

ExpertStageShape preset_expert_stage(const MoePreset& p, int batch, bool routed) {
  ExpertStageShape s;
  s.feature = p.feature;
  s.ffn = p.ffn;
  s.output = p.feature;  // the presets' O is H
  s.tokens = batch;
  s.top_k = p.top_k;
  if (routed) {
    const MoeConfig c = preset_config(p, DType::bf16);
    s.group_rows = routed_group_sizes(c, reference::make_moe_input(c, batch, c.seed + 1));
  } else {
    const int64_t rows = int64_t(batch) * p.top_k;
    for (int e = 0; e < p.experts; ++e)
      s.group_rows.push_back(rows / p.experts + (e < rows % p.experts ? 1 : 0));
  }
  return s;
}

}  // namespace pmoe::bench
