// `pmoe-bench model published`: the model's prediction for pmoe's protocol on the hardware of
// each published row, beside the published time (mean), and predicted / published.
//   pplx-kernels README: NVLink EP8, IBGDA and IBRC EP16..EP128, 1 and 128 tokens
//     per GPU; assumed H100 + NVLink 4 + 400 Gb/s IB per GPU, 8 per node (presets h100-ib,
//     h100-ibrc), DeepSeek-V3 shape (the README does not state it).
//   DeepEP README, low-latency kernels (128 tokens, H 7168, top-8, fp8 dispatch, bf16 combine,
//     H800 + CX7 400 Gb/s): the first table (Feb 2025, pure RDMA: every peer over the network,
//     modelled with 1 rank per node; also the DeepEP rows of pplx-kernels' README) and the later
//     one (NVLink used inside the node: 8 ranks per node).
// The protocols differ (DeepEP LL sends a token once per expert, pmoe once per rank), so a ratio
// is pmoe-on-that-hardware over theirs, not only the model's error.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bench_common.hpp"
#include "model_bench.hpp"
#include "pmoe/error.hpp"
#include "report.hpp"

namespace pmoe::bench {

namespace {

using nlohmann::json;

struct PublishedRow {
  const char* source;
  const char* row;  // op and transport, as published
  const char* preset;
  int ranks_per_node;
  bool dispatch;
  int tokens;
  int ranks;
  double us;
};

// Means as published (± spreads left out).
const PublishedRow kPublished[] = {
    // pplx-kernels, 1 token per GPU.
    {"pplx", "NVLINK Dispatch", "h100-ib", 8, true, 1, 8, 41.6},
    {"pplx", "NVLINK Combine", "h100-ib", 8, false, 1, 8, 41.7},
    {"pplx", "IBGDA Dispatch", "h100-ib", 8, true, 1, 16, 102.7},
    {"pplx", "IBGDA Dispatch", "h100-ib", 8, true, 1, 32, 115.7},
    {"pplx", "IBGDA Dispatch", "h100-ib", 8, true, 1, 64, 121.0},
    {"pplx", "IBGDA Dispatch", "h100-ib", 8, true, 1, 128, 125.9},
    {"pplx", "IBGDA Combine", "h100-ib", 8, false, 1, 16, 62.7},
    {"pplx", "IBGDA Combine", "h100-ib", 8, false, 1, 32, 55.4},
    {"pplx", "IBGDA Combine", "h100-ib", 8, false, 1, 64, 58.6},
    {"pplx", "IBGDA Combine", "h100-ib", 8, false, 1, 128, 63.2},
    {"pplx", "IBRC Dispatch", "h100-ibrc", 8, true, 1, 16, 290.5},
    {"pplx", "IBRC Dispatch", "h100-ibrc", 8, true, 1, 32, 421.2},
    {"pplx", "IBRC Dispatch", "h100-ibrc", 8, true, 1, 64, 525.0},
    {"pplx", "IBRC Dispatch", "h100-ibrc", 8, true, 1, 128, 488.4},
    {"pplx", "IBRC Combine", "h100-ibrc", 8, false, 1, 16, 85.9},
    {"pplx", "IBRC Combine", "h100-ibrc", 8, false, 1, 32, 122.1},
    {"pplx", "IBRC Combine", "h100-ibrc", 8, false, 1, 64, 400.0},
    {"pplx", "IBRC Combine", "h100-ibrc", 8, false, 1, 128, 786.8},
    // pplx-kernels, 128 tokens per GPU.
    {"pplx", "NVLINK Dispatch", "h100-ib", 8, true, 128, 8, 83.6},
    {"pplx", "NVLINK Combine", "h100-ib", 8, false, 128, 8, 102.3},
    {"pplx", "IBGDA Dispatch", "h100-ib", 8, true, 128, 16, 622.4},
    {"pplx", "IBGDA Dispatch", "h100-ib", 8, true, 128, 32, 427.6},
    {"pplx", "IBGDA Dispatch", "h100-ib", 8, true, 128, 64, 317.4},
    {"pplx", "IBGDA Dispatch", "h100-ib", 8, true, 128, 128, 307.7},
    {"pplx", "IBGDA Combine", "h100-ib", 8, false, 128, 16, 668.1},
    {"pplx", "IBGDA Combine", "h100-ib", 8, false, 128, 32, 481.4},
    {"pplx", "IBGDA Combine", "h100-ib", 8, false, 128, 64, 529.9},
    {"pplx", "IBGDA Combine", "h100-ib", 8, false, 128, 128, 593.9},
    {"pplx", "IBRC Dispatch", "h100-ibrc", 8, true, 128, 16, 687.1},
    {"pplx", "IBRC Dispatch", "h100-ibrc", 8, true, 128, 32, 973.5},
    {"pplx", "IBRC Dispatch", "h100-ibrc", 8, true, 128, 64, 1669.3},
    {"pplx", "IBRC Dispatch", "h100-ibrc", 8, true, 128, 128, 2038.5},
    {"pplx", "IBRC Combine", "h100-ibrc", 8, false, 128, 16, 633.4},
    {"pplx", "IBRC Combine", "h100-ibrc", 8, false, 128, 32, 916.5},
    {"pplx", "IBRC Combine", "h100-ibrc", 8, false, 128, 64, 1058.5},
    {"pplx", "IBRC Combine", "h100-ibrc", 8, false, 128, 128, 1184.8},
    // DeepEP low latency, pure RDMA (Feb 2025 README; the DeepEP rows of pplx-kernels' README).
    {"DeepEP", "LL Dispatch (pure RDMA)", "h800-ib", 1, true, 128, 8, 163},
    {"DeepEP", "LL Dispatch (pure RDMA)", "h800-ib", 1, true, 128, 16, 173},
    {"DeepEP", "LL Dispatch (pure RDMA)", "h800-ib", 1, true, 128, 32, 182},
    {"DeepEP", "LL Dispatch (pure RDMA)", "h800-ib", 1, true, 128, 64, 186},
    {"DeepEP", "LL Dispatch (pure RDMA)", "h800-ib", 1, true, 128, 128, 192},
    {"DeepEP", "LL Dispatch (pure RDMA)", "h800-ib", 1, true, 128, 256, 194},
    {"DeepEP", "LL Combine (pure RDMA)", "h800-ib", 1, false, 128, 8, 318},
    {"DeepEP", "LL Combine (pure RDMA)", "h800-ib", 1, false, 128, 16, 329},
    {"DeepEP", "LL Combine (pure RDMA)", "h800-ib", 1, false, 128, 32, 350},
    {"DeepEP", "LL Combine (pure RDMA)", "h800-ib", 1, false, 128, 64, 353},
    {"DeepEP", "LL Combine (pure RDMA)", "h800-ib", 1, false, 128, 128, 369},
    {"DeepEP", "LL Combine (pure RDMA)", "h800-ib", 1, false, 128, 256, 360},
    // DeepEP low latency, NVLink inside the node (later README, legacy docs).
    {"DeepEP", "LL Dispatch (NVLink in node)", "h800-ib", 8, true, 128, 8, 77},
    {"DeepEP", "LL Dispatch (NVLink in node)", "h800-ib", 8, true, 128, 16, 118},
    {"DeepEP", "LL Dispatch (NVLink in node)", "h800-ib", 8, true, 128, 32, 155},
    {"DeepEP", "LL Dispatch (NVLink in node)", "h800-ib", 8, true, 128, 64, 173},
    {"DeepEP", "LL Dispatch (NVLink in node)", "h800-ib", 8, true, 128, 128, 192},
    {"DeepEP", "LL Dispatch (NVLink in node)", "h800-ib", 8, true, 128, 256, 194},
    {"DeepEP", "LL Combine (NVLink in node)", "h800-ib", 8, false, 128, 8, 114},
    {"DeepEP", "LL Combine (NVLink in node)", "h800-ib", 8, false, 128, 16, 195},
    {"DeepEP", "LL Combine (NVLink in node)", "h800-ib", 8, false, 128, 32, 273},
    {"DeepEP", "LL Combine (NVLink in node)", "h800-ib", 8, false, 128, 64, 314},
    {"DeepEP", "LL Combine (NVLink in node)", "h800-ib", 8, false, 128, 128, 369},
    {"DeepEP", "LL Combine (NVLink in node)", "h800-ib", 8, false, 128, 256, 360},
};

void run(const ModelShape& shape, uint64_t seed, const std::string& json_path) {
  json rows = json::array();
  std::printf(
      "## pmoe-bench model published: pmoe's protocol predicted on each published row's "
      "hardware (direct mode, uniform routing, E=%d, top-k=%d, H=%d, %s dispatch, %s "
      "combine); commit %s\n\n",
      shape.experts, shape.topk, shape.hidden, shape.dtype.c_str(), shape.out_dtype.c_str(),
      git_commit().c_str());
  std::printf(
      "| source | row | tokens | EP | preset, ranks/node | published µs | predicted µs | "
      "predicted/published |\n|---|---|---:|---:|---|---:|---:|---:|\n");
  double worst = 1;
  const PublishedRow* worst_row = nullptr;
  for (const PublishedRow& p : kPublished) {
    const HardwarePreset hw = find_preset(p.preset);
    const ModelRow r = model_row(shape, hw, p.ranks, p.ranks_per_node, p.tokens,
                                 detail::TrafficMode::direct, "uniform", seed);
    const double us = p.dispatch ? r.prediction.dispatch.us : r.prediction.combine.us;
    const double ratio = us / p.us;
    // The worst ratio is the one furthest from 1 either way.
    if (!worst_row || std::abs(std::log(ratio)) > std::abs(std::log(worst)))
      worst = ratio, worst_row = &p;
    std::printf("| %s | %s | %d | %d | %s, %d | %.1f | %.1f | %.2f |\n", p.source, p.row, p.tokens,
                p.ranks, p.preset, p.ranks_per_node, p.us, us, ratio);
    rows.push_back({{"source", p.source},
                    {"row", p.row},
                    {"tokens", p.tokens},
                    {"ranks", p.ranks},
                    {"preset", p.preset},
                    {"ranks_per_node", p.ranks_per_node},
                    {"published_us", p.us},
                    {"predicted_us", us},
                    {"ratio", ratio}});
  }
  std::printf("\nworst predicted/published: %.2f (%s %s, %d tokens, EP%d)\n", worst,
              worst_row->source, worst_row->row, worst_row->tokens, worst_row->ranks);
  if (!json_path.empty())
    write_json(json_path, {{"shape", shape.to_json()}, {"seed", seed}}, rows,
               {{"worst_ratio", worst}});
}

}  // namespace

void add_published_command(CLI::App& model) {
  auto shape = std::make_shared<ModelShape>();
  auto seed = std::make_shared<uint64_t>(1);
  auto json_path = std::make_shared<std::string>();
  CLI::App* cmd = model.add_subcommand(
      "published", "predicted / published for pplx-kernels' and DeepEP's published rows");
  add_shape_options(cmd, *shape);
  cmd->add_option("--seed", *seed, "routing seed")->capture_default_str();
  cmd->add_option("--json", *json_path, "write the rows as JSON to this file");
  cmd->callback([=] { run(*shape, *seed, *json_path); });
}

}  // namespace pmoe::bench
