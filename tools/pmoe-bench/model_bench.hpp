// What the `pmoe-bench model` subcommands share: the MoE shape, and one predicted configuration.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "all_to_all/traffic.hpp"
#include "model_links.hpp"
#include "pmoe/all_to_all.hpp"

namespace pmoe::bench {

// DeepSeek-V3's decode shape by default: 256 experts, top-8, H 7168, fp8 dispatch with 128-element
// scales, bf16 combine (the shape of pplx-kernels' and DeepEP's published tables).
struct ModelShape {
  int experts = 256, topk = 8, hidden = 7168;
  std::string dtype = "f8e4m3";
  int scale_block = 128;
  std::string out_dtype = "bf16";
  nlohmann::json to_json() const;
};
void add_shape_options(CLI::App* cmd, ModelShape& s);

// The config the model counts for W ranks (E rounded up to a multiple of W).
AllToAllConfig model_config(const ModelShape& s, int world_size, int tokens);

struct ModelRow {
  detail::Traffic traffic;
  Prediction prediction;
  int experts = 0;
};
// Counts the routing's traffic and predicts both ops (CPU presets: predict_cpu).
ModelRow model_row(const ModelShape& s, const HardwarePreset& hw, int world_size,
                   int ranks_per_node, int tokens, detail::TrafficMode mode,
                   const std::string& routing, uint64_t seed, bool relay_reduces = false);

void add_published_command(CLI::App& model);  // model_published.cpp
void add_calibrate_command(CLI::App& model);  // model_calibrate.cpp
void add_expert_stage_command(CLI::App& model);  // model_expert_stage.cpp

}  // namespace pmoe::bench
