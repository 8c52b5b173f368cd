// `pmoe-bench model`: predicted dispatch/combine time from EP8 to EP1024 for a hardware preset,
// from pmoe's own byte counts (src/all_to_all/traffic.hpp) and the link model
// (model_links.hpp); `pmoe-bench model published` holds the predictions against pplx-kernels'
// and DeepEP's published tables; `pmoe-bench model calibrate` (model_calibrate.cpp) measures this
// machine's links and checks the CPU prediction against a run. No rank runs for `model`.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "model_bench.hpp"
#include "model_links.hpp"
#include "model_routing.hpp"
#include "pmoe/error.hpp"
#include "report.hpp"
#include "subcommands.hpp"

namespace pmoe::bench {

using detail::Link;
using detail::TrafficMode;
using nlohmann::json;

AllToAllConfig model_config(const ModelShape& s, int world_size, int tokens) {
  AllToAllConfig c;
  c.max_tokens = tokens;
  // At least one expert per rank: EP512 and EP1024 with 256 experts round E up to W.
  c.num_experts = (std::max(s.experts, world_size) + world_size - 1) / world_size * world_size;
  c.top_k = s.topk;
  c.hidden_dim = s.hidden;
  c.in_dtype = parse_dtype(s.dtype);
  c.scale_block = c.in_dtype == DType::f8e4m3 ? s.scale_block : 0;
  c.out_dtype = parse_dtype(s.out_dtype);
  c.validate(world_size);
  return c;
}

ModelRow model_row(const ModelShape& s, const HardwarePreset& hw, int W, int ranks_per_node,
                   int tokens, TrafficMode mode, const std::string& routing, uint64_t seed,
                   bool relay_reduces) {
  const AllToAllConfig c = model_config(s, W, tokens);
  const auto indices = make_routing(routing, W, tokens, c.top_k, c.num_experts, seed);
  ModelRow row;
  row.traffic =
      detail::count_traffic(c, {W, std::min(ranks_per_node, W), mode, relay_reduces}, indices);
  const double slot = double(c.hidden_dim) * dtype_size(c.in_dtype) + 4.0 * c.scales_per_token();
  const double y_row = double(c.hidden_dim) * dtype_size(c.out_dtype);
  row.prediction = hw.cores ? predict_cpu(hw, row.traffic, slot, y_row, tokens, y_row)
                            : predict(hw, row.traffic, mode, slot, y_row, relay_reduces);
  row.experts = c.num_experts;
  return row;
}

namespace {

struct Options {
  ModelShape shape;
  std::string preset = "h100-ib", preset_file;
  std::string ranks = "8,16,32,64,128,256,512,1024";
  std::string tokens = "128";
  std::string modes = "direct,hierarchical";
  int ranks_per_node = 0;  // 0: the preset's
  std::string routing = "uniform";
  uint64_t seed = 1;
  bool relay_reduces = false;
  std::string json_path, plot_path;
};

uint64_t most(const detail::OpTraffic& op, Link l) {
  uint64_t m = 0;
  for (const auto& r : op.ranks) m = std::max({m, r.sent[int(l)].bytes, r.received[int(l)].bytes});
  return m;
}

json row_json(const char* op, TrafficMode mode, int W, int tokens, const ModelRow& r) {
  const auto& p = std::string(op) == "dispatch" ? r.prediction.dispatch : r.prediction.combine;
  const auto& t = std::string(op) == "dispatch" ? r.traffic.dispatch : r.traffic.combine;
  return {{"op", op},
          {"mode", detail::mode_name(mode)},
          {"series", std::string(op) + " " + detail::mode_name(mode)},
          {"ranks", W},
          {"tokens", tokens},
          {"experts", r.experts},
          {"predicted_us", p.us},
          {"critical_rank", p.critical_rank},
          {"launch_us", p.launch_us},
          {"exchange_us", p.exchange_us},
          {"local_us", p.local_us},
          {"network_mb_per_rank_max", most(t, Link::network) / 1e6},
          {"network_mb_total", t.total(Link::network).bytes / 1e6},
          {"network_mb_per_rank_mean", t.total(Link::network).bytes / 1e6 / W},
          {"load_store_mb_per_rank_max", most(t, Link::load_store) / 1e6},
          {"network_transfers_total", t.total(Link::network).transfers}};
}

void print_table(const json& rows, int tokens, const std::vector<int>& ranks, const char* key,
                 const char* what, const char* fmt) {
  std::printf("\n### %d token%s per rank: %s\n\n| op and transport |", tokens,
              tokens == 1 ? "" : "s", what);
  for (int W : ranks) std::printf(" EP%d |", W);
  std::printf("\n|---|");
  for (size_t i = 0; i < ranks.size(); ++i) std::printf("---:|");
  std::printf("\n");
  std::vector<std::string> series;
  for (const auto& r : rows)
    if (r["tokens"] == tokens &&
        std::find(series.begin(), series.end(), r["series"]) == series.end())
      series.push_back(r["series"]);
  for (const auto& name : series) {
    std::printf("| %s |", name.c_str());
    for (int W : ranks) {
      std::string cell = "x";
      for (const auto& r : rows)
        if (r["series"] == name && r["ranks"] == W && r["tokens"] == tokens)
          cell = format(fmt, r[key].get<double>());
      std::printf(" %s |", cell.c_str());
    }
    std::printf("\n");
  }
}

void run(const Options& o) {
  const HardwarePreset hw =
      o.preset_file.empty() ? find_preset(o.preset) : load_preset(o.preset_file);
  const int per_node = o.ranks_per_node ? o.ranks_per_node : hw.ranks_per_node;
  PMOE_CHECK(per_node >= 1, "--ranks-per-node must be >= 1, got ", per_node);
  const std::vector<int> ranks = parse_int_list(o.ranks, "--ranks");
  const std::vector<int> token_counts = parse_int_list(o.tokens, "--tokens");
  std::vector<TrafficMode> modes;
  for (size_t at = 0; at <= o.modes.size();) {
    const size_t comma = std::min(o.modes.find(',', at), o.modes.size());
    const std::string m = o.modes.substr(at, comma - at);
    PMOE_CHECK(m == "direct" || m == "hierarchical",
               "--modes: direct and/or hierarchical, comma-separated; got '", m, "'");
    modes.push_back(m == "direct" ? TrafficMode::direct : TrafficMode::hierarchical);
    at = comma + 1;
  }
  json rows = json::array();
  for (int tokens : token_counts)
    for (TrafficMode mode : modes)
      for (int W : ranks) {
        PMOE_CHECK(W % std::min(per_node, W) == 0, "--ranks: ", W,
                   " is not a multiple of --ranks-per-node ", per_node);
        const ModelRow r =
            model_row(o.shape, hw, W, per_node, tokens, mode, o.routing, o.seed, o.relay_reduces);
        rows.push_back(row_json("dispatch", mode, W, tokens, r));
        rows.push_back(row_json("combine", mode, W, tokens, r));
      }
  std::sort(rows.begin(), rows.end(), [](const json& a, const json& b) {
    return std::make_tuple(a["tokens"].get<int>(), a["op"].get<std::string>(),
                           a["mode"].get<std::string>(), a["ranks"].get<int>()) <
           std::make_tuple(b["tokens"].get<int>(), b["op"].get<std::string>(),
                           b["mode"].get<std::string>(), b["ranks"].get<int>());
  });
  std::printf(
      "## pmoe-bench model: %s, %d ranks per node\n\n%s\n\nE=%d (at least 1 per rank), "
      "top-k=%d, H=%d, %s%s, combine %s, routing %s%s; commit %s\n",
      hw.name.c_str(), per_node, hw.description.c_str(), o.shape.experts, o.shape.topk,
      o.shape.hidden, o.shape.dtype.c_str(),
      o.shape.dtype == "f8e4m3"
          ? (" (scale block " + std::to_string(o.shape.scale_block) + ")").c_str()
          : "",
      o.shape.out_dtype.c_str(), o.routing.c_str(),
      o.relay_reduces ? ", hierarchical combine: the relay sums its node's rows" : "",
      git_commit().c_str());
  for (int tokens : token_counts) {
    print_table(rows, tokens, ranks, "predicted_us", "predicted time (µs, critical-path rank)",
                "%.1f");
    print_table(rows, tokens, ranks, "network_mb_per_rank_max",
                "network MB of the busiest rank (sent or received)", "%.3f");
    print_table(rows, tokens, ranks, "network_mb_per_rank_mean",
                "network MB sent per rank, mean over ranks", "%.3f");
    print_table(rows, tokens, ranks, "critical_rank", "critical-path rank", "%.0f");
  }
  if (!o.json_path.empty())
    write_json(o.json_path,
               {{"preset", hw.to_json()},
                {"ranks_per_node", per_node},
                {"routing", o.routing},
                {"shape", o.shape.to_json()}},
               rows);
  if (!o.plot_path.empty()) {
    plot_sweep(o.plot_path, rows,
               {"ranks", "EP size (ranks)", "predicted_us", "predicted time (µs)",
                "pmoe model, " + hw.name, "series", "tokens", "tokens per rank", true, false, "",
                "", true});
    std::string bytes_path = o.plot_path;
    const size_t dot = bytes_path.rfind(".png");
    bytes_path.insert(dot == std::string::npos ? bytes_path.size() : dot, "_network");
    plot_sweep(bytes_path, rows,
               {"ranks", "EP size (ranks)", "network_mb_per_rank_max", "network MB, busiest rank",
                "pmoe model, " + hw.name, "series", "tokens", "tokens per rank", true, false, "",
                "", true});
    std::printf("\nplots: %s, %s\n", o.plot_path.c_str(), bytes_path.c_str());
  }
}

}  // namespace

json ModelShape::to_json() const {
  return {{"experts", experts},         {"topk", topk},
          {"hidden", hidden},           {"dtype", dtype},
          {"scale_block", scale_block}, {"out_dtype", out_dtype}};
}

void add_shape_options(CLI::App* cmd, ModelShape& s) {
  cmd->add_option("--experts", s.experts, "experts (rounded up to a multiple of the ranks)")
      ->capture_default_str();
  cmd->add_option("--topk", s.topk, "experts per token")->capture_default_str();
  cmd->add_option("--hidden", s.hidden, "hidden dimension")->capture_default_str();
  cmd->add_option("--dtype", s.dtype, "dispatch payload dtype (f8e4m3, bf16, f16, f32)")
      ->capture_default_str();
  cmd->add_option("--scale-block", s.scale_block, "f8e4m3: elements per f32 scale")
      ->capture_default_str();
  cmd->add_option("--out-dtype", s.out_dtype, "combine row dtype")->capture_default_str();
}

void add_model_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "model",
      "predicted dispatch/combine time EP8..EP1024 from pmoe's byte counts and a link "
      "model (docs/scaling-model.md)");
  add_shape_options(cmd, o->shape);
  cmd->add_option("--preset", o->preset,
                  "hardware preset (h100-ib, h100-ibrc, h200-ib, h800-ib, "
                  "gb200-nvl72, aws-efa-p5, aws-efa-p5en)")
      ->capture_default_str();
  cmd->add_option("--preset-file", o->preset_file, "a preset file from `model calibrate`");
  cmd->add_option("--ranks", o->ranks, "EP sizes, comma-separated")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "tokens per rank, comma-separated")->capture_default_str();
  cmd->add_option("--modes", o->modes, "direct and/or hierarchical")->capture_default_str();
  cmd->add_option("--ranks-per-node", o->ranks_per_node, "ranks per node (default: the preset's)");
  cmd->add_option("--routing", o->routing, "uniform, zipf:S or file:PATH (k ids per token)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "routing seed")->capture_default_str();
  cmd->add_flag("--relay-reduces", o->relay_reduces,
                "hierarchical combine with AllToAllConfig::combine_sums_in_node: each node's relay "
                "sums its node's rows and puts one partial per (token, node), counted as those "
                "kernels send it (weights and partial heads included)");
  cmd->add_option("--json", o->json_path, "write the rows as JSON to this file");
  cmd->add_option("--plot", o->plot_path,
                  "draw predicted time to this PNG, and network bytes to NAME_network.png");
  add_published_command(*cmd);
  add_calibrate_command(*cmd);
  add_expert_stage_command(*cmd);
  cmd->callback([o, cmd] {
    if (cmd->get_subcommands().empty()) run(*o);
  });
}

}  // namespace pmoe::bench
