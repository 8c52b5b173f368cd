// `pmoe-bench model expert-stage`: the expert stage's model (expert_stage_model.hpp) for the
// presets at a batch, on a named GPU: pmoe's stage and torch._grouped_mm's, each kernel's µs,
// and pmoe's rate as a fraction of torch's. The groups are pmoe's router's for the preset's batch
// (what `pmoe-bench moe --device cuda` gives both sides), or an even split (--groups even: what
// torch got before its baseline took pmoe's groups). No rank runs.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_common.hpp"
#include "expert_stage_model.hpp"
#include "moe_presets.hpp"
#include "pmoe/error.hpp"
#include "report.hpp"

// add_expert_stage_command is declared in model_bench.hpp, which this file cannot include beside
// kernel_model.hpp: the link model and the kernel model each name a struct OpPrediction.

namespace pmoe::bench {
namespace {

using nlohmann::json;

struct Options {
  std::string gpus = "h100-sxm,h200";
  std::string presets = "mixtral-8x7b,deepseek-v3";
  std::string batches = "1024";
  std::string groups = "routed";
  std::string json_path;
};

json kernels_json(const StagePrediction& stage) {
  json out = json::array();
  for (const StageKernel& k : stage.kernels)
    out.push_back({{"kernel", k.kernel}, {"what", k.what}, {"us", k.us}, {"bytes", k.bytes},
                   {"issued_flops", k.issued_flops}});
  return out;
}

void print_stage(const char* who, const StagePrediction& stage) {
  std::printf("| %s | %.1f | %.0f |", who, stage.us, stage.tflops());
  for (const StageKernel& k : stage.kernels)
    std::printf(" %s%s%s%s %.1f;", k.kernel.c_str(), k.what.empty() ? "" : " (", k.what.c_str(),
                k.what.empty() ? "" : ")", k.us);
  std::printf(" |\n");
}

void run(const Options& o) {
  PMOE_CHECK(o.groups == "routed" || o.groups == "even", "--groups must be routed or even, got '",
             o.groups, "'");
  const std::vector<int> batches = parse_int_list(o.batches, "--batch");
  json rows = json::array();
  for (const std::string& preset_name : split_names(o.presets)) {
    const MoePreset& preset = find_moe_preset(preset_name);
    for (int batch : batches) {
      PMOE_CHECK(batch >= 1, "--batch must be >= 1, got ", batch);
      const ExpertStageShape shape = preset_expert_stage(preset, batch, o.groups == "routed");
      for (const std::string& gpu_name : split_names(o.gpus)) {
        const GpuSpec& gpu = find_gpu(gpu_name);
        const ExpertStagePrediction p = predict_expert_stage(gpu, shape);
        std::printf(
            "\n%s expert stage, batch %d, %s groups (%lld to %lld rows an expert), %s: pmoe's "
            "rate %.2f of torch's\n\n| stage | µs | TFLOP/s | kernels (µs) |\n| --- | ---: | ---: "
            "| --- |\n",
            preset.name, batch, o.groups.c_str(),
            (long long)*std::min_element(shape.group_rows.begin(), shape.group_rows.end()),
            (long long)*std::max_element(shape.group_rows.begin(), shape.group_rows.end()),
            gpu.description.c_str(), p.ratio());
        print_stage("pmoe", p.pmoe);
        print_stage("torch._grouped_mm", p.torch);
        rows.push_back({{"preset", preset.name},
                        {"batch", batch},
                        {"gpu", gpu.name},
                        {"groups", o.groups},
                        {"group_sizes", shape.group_rows},
                        {"pmoe_us", p.pmoe.us},
                        {"torch_us", p.torch.us},
                        {"pmoe_over_torch_rate", p.ratio()},
                        {"pmoe_tflops", p.pmoe.tflops()},
                        {"torch_tflops", p.torch.tflops()},
                        {"pmoe_kernels", kernels_json(p.pmoe)},
                        {"torch_kernels", kernels_json(p.torch)}});
      }
    }
  }
  if (!o.json_path.empty())
    write_json(o.json_path, {{"gpus", o.gpus}, {"presets", o.presets}, {"groups", o.groups}}, rows);
}

}  // namespace

void add_expert_stage_command(CLI::App& model) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = model.add_subcommand(
      "expert-stage",
      "one rank's expert stage at a preset's shape on an H100/H200, pmoe's against "
      "torch._grouped_mm's, from the expert stage's model (docs/gpu-all-to-all.md)");
  cmd->add_option("--gpu", o->gpus, "GPUs of the kernel model, comma-separated")
      ->capture_default_str();
  cmd->add_option("--preset", o->presets, "pmoe-bench moe presets, comma-separated")
      ->capture_default_str();
  cmd->add_option("--batch", o->batches, "tokens, comma-separated")->capture_default_str();
  cmd->add_option("--groups", o->groups,
                  "routed (pmoe's router's rows an expert) or even (an even split)")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "write the rows as JSON to this file");
  cmd->callback([o] { run(*o); });
}

}  // namespace pmoe::bench
