// `pmoe-bench model published`: the model's prediction for pmoe's protocol on the hardware of
// each published row, beside the published time (mean or median, as published), and
// predicted / published. Sources, shapes and hardware assumptions: docs/scaling-model.md
// ("Predicted against published"); in short:
//   pplx-kernels README: NVLink EP8, IBGDA and IBRC EP16..EP128, 1 and 128 tokens
//     per GPU; assumed H100 + NVLink 4 + 400 Gb/s IB per GPU, 8 per node (presets h100-ib,
//     h100-ibrc), DeepSeek-V3 shape (the README does not state it).
//   DeepEP README, low-latency kernels (128 tokens, H 7168, top-8, fp8 dispatch, bf16 combine,
//     H800 + CX7 400 Gb/s): the first table (Feb 2025, pure RDMA: every peer over the network,
//     modelled with 1 rank per node; also the DeepEP rows of pplx-kernels' README) and the later
//     one (NVLink used inside the node: 8 ranks per node).
//   TensorRT-LLM tech blog 18, NVLinkOneSided on GB200 NVL72 (one NVLink domain), bf16 both ways.
//   pplx-garden docs/fabric-lib.md, CX7 and EFA (p5en), 8 per node, NVLink inside the node.
//   UCCL-EP ep/README.md, low-latency kernels, pure RDMA on p5en (1 rank per node modelled).
//   NCCL EP contrib/nccl_ep/README.md and DeepEP V2 README: bandwidth rows, turned into µs with
//     the byte count each benchmark divides by (see published_us).
// The protocols differ (DeepEP LL sends a token once per expert, pmoe once per rank), so a ratio
// is pmoe-on-that-hardware over theirs, not only the model's error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.hpp"
#include "model_bench.hpp"
#include "pmoe/error.hpp"
#include "report.hpp"

namespace pmoe::bench {

namespace {

using nlohmann::json;

// How a row's published figure becomes µs.
enum class Figure {
  us,                  // a time, as published
  gbps_per_selection,  // GB/s of tokens x top-k rows (DeepEP's low-latency convention, NCCL EP)
  gbps_per_node,       // GB/s of (token, node) rows, the own node included (DeepEP normal, RDMA)
  gbps_per_rank,       // GB/s of (token, rank) rows, the own rank included (DeepEP normal, NVLink)
};

struct PublishedRow {
  const char* source;
  const char* row;  // op and transport, as published
  const char* preset;
  int ranks_per_node;
  bool dispatch;
  int tokens;
  int ranks;
  double value;  // µs, or GB/s (see figure)
  Figure figure = Figure::us;
  const char* dtype = nullptr;  // dispatch payload when not the shape's (bf16 rows)
  detail::TrafficMode mode = detail::TrafficMode::direct;
  bool relay_reduces = false;  // hierarchical combine with combine_sums_in_node (relay sums)
};

constexpr auto kHier = detail::TrafficMode::hierarchical;
constexpr auto kUs = Figure::us;
constexpr const char* kBf16 = "bf16";
constexpr auto kPerSelection = Figure::gbps_per_selection;
constexpr auto kPerNode = Figure::gbps_per_node;
constexpr auto kPerRank = Figure::gbps_per_rank;

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
    // TensorRT-LLM NVLinkOneSided on GB200 NVL72 (tech blog 18): one NVLink domain of 72 GPUs,
    // bf16 dispatch and combine, kernel times.
    {"TRT-LLM", "NVLinkOneSided Dispatch", "gb200-nvl72", 72, true, 128, 8, 31.7, kUs, kBf16},
    {"TRT-LLM", "NVLinkOneSided Dispatch", "gb200-nvl72", 72, true, 128, 16, 34.6, kUs, kBf16},
    {"TRT-LLM", "NVLinkOneSided Dispatch", "gb200-nvl72", 72, true, 128, 32, 37.8, kUs, kBf16},
    {"TRT-LLM", "NVLinkOneSided Dispatch", "gb200-nvl72", 72, true, 128, 64, 41.6, kUs, kBf16},
    {"TRT-LLM", "NVLinkOneSided Combine", "gb200-nvl72", 72, false, 128, 8, 38.1, kUs, kBf16},
    {"TRT-LLM", "NVLinkOneSided Combine", "gb200-nvl72", 72, false, 128, 16, 39.9, kUs, kBf16},
    {"TRT-LLM", "NVLinkOneSided Combine", "gb200-nvl72", 72, false, 128, 32, 41.1, kUs, kBf16},
    {"TRT-LLM", "NVLinkOneSided Combine", "gb200-nvl72", 72, false, 128, 64, 44.5, kUs, kBf16},
    // pplx-garden (docs/fabric-lib.md), decode, 128 tokens, fp8 dispatch, bf16 combine, NVLink
    // inside the node (8 per node), RDMA across: ConnectX-7 and AWS EFA.
    {"pplx-garden", "CX7 Dispatch", "h200-ib", 8, true, 128, 8, 50.5},
    {"pplx-garden", "CX7 Dispatch", "h200-ib", 8, true, 128, 16, 110.2},
    {"pplx-garden", "CX7 Dispatch", "h200-ib", 8, true, 128, 32, 153.9},
    {"pplx-garden", "CX7 Dispatch", "h200-ib", 8, true, 128, 64, 187.5},
    {"pplx-garden", "CX7 Combine", "h200-ib", 8, false, 128, 8, 65.3},
    {"pplx-garden", "CX7 Combine", "h200-ib", 8, false, 128, 16, 185.5},
    {"pplx-garden", "CX7 Combine", "h200-ib", 8, false, 128, 32, 266.3},
    {"pplx-garden", "CX7 Combine", "h200-ib", 8, false, 128, 64, 309.1},
    {"pplx-garden", "EFA Dispatch", "aws-efa-p5en", 8, true, 128, 8, 49.7},
    {"pplx-garden", "EFA Dispatch", "aws-efa-p5en", 8, true, 128, 16, 214.8},
    {"pplx-garden", "EFA Dispatch", "aws-efa-p5en", 8, true, 128, 32, 229.1},
    {"pplx-garden", "EFA Dispatch", "aws-efa-p5en", 8, true, 128, 64, 266.7},
    {"pplx-garden", "EFA Combine", "aws-efa-p5en", 8, false, 128, 8, 64.2},
    {"pplx-garden", "EFA Combine", "aws-efa-p5en", 8, false, 128, 16, 241.5},
    {"pplx-garden", "EFA Combine", "aws-efa-p5en", 8, false, 128, 32, 335.0},
    {"pplx-garden", "EFA Combine", "aws-efa-p5en", 8, false, 128, 64, 391.2},
    // UCCL-EP (ep/README.md) low-latency kernels, pure RDMA on p5en: every peer over the network.
    {"UCCL-EP", "LL Dispatch (pure RDMA, EFA)", "aws-efa-p5en", 1, true, 128, 16, 226},
    {"UCCL-EP", "LL Dispatch (pure RDMA, EFA)", "aws-efa-p5en", 1, true, 128, 24, 386},
    {"UCCL-EP", "LL Dispatch (pure RDMA, EFA)", "aws-efa-p5en", 1, true, 128, 32, 465},
    {"UCCL-EP", "LL Combine (pure RDMA, EFA)", "aws-efa-p5en", 1, false, 128, 16, 293},
    {"UCCL-EP", "LL Combine (pure RDMA, EFA)", "aws-efa-p5en", 1, false, 128, 24, 580},
    {"UCCL-EP", "LL Combine (pure RDMA, EFA)", "aws-efa-p5en", 1, false, 128, 32, 694},
    // NCCL EP (contrib/nccl_ep/README.md), low-latency mode on H100, bf16 both ways, GB/s.
    {"NCCL EP", "LL Dispatch", "h100-ib", 8, true, 128, 8, 224.3, kPerSelection, kBf16},
    {"NCCL EP", "LL Dispatch", "h100-ib", 8, true, 128, 16, 76.7, kPerSelection, kBf16},
    {"NCCL EP", "LL Dispatch", "h100-ib", 8, true, 128, 32, 53.6, kPerSelection, kBf16},
    {"NCCL EP", "LL Dispatch", "h100-ib", 8, true, 128, 64, 48.8, kPerSelection, kBf16},
    {"NCCL EP", "LL Combine", "h100-ib", 8, false, 128, 8, 185.2, kPerSelection, kBf16},
    {"NCCL EP", "LL Combine", "h100-ib", 8, false, 128, 16, 73.0, kPerSelection, kBf16},
    {"NCCL EP", "LL Combine", "h100-ib", 8, false, 128, 32, 50.0, kPerSelection, kBf16},
    {"NCCL EP", "LL Combine", "h100-ib", 8, false, 128, 64, 43.8, kPerSelection, kBf16},
    // DeepEP V2 (NCCL Gin backend, README), normal kernels, 8192 tokens, fp8 dispatch, bf16
    // combine, GB/s: SM90 + CX7 as 8 x 2 and 8 x 4 (pmoe's hierarchical mode), SM100 EP8 NVLink.
    {"DeepEP V2", "Dispatch (RDMA)", "h800-ib", 8, true, 8192, 16, 90, kPerNode, nullptr, kHier},
    {"DeepEP V2", "Dispatch (RDMA)", "h800-ib", 8, true, 8192, 32, 61, kPerNode, nullptr, kHier},
    {"DeepEP V2", "Combine (RDMA)", "h800-ib", 8, false, 8192, 16, 81, kPerNode, nullptr, kHier},
    {"DeepEP V2", "Combine (RDMA)", "h800-ib", 8, false, 8192, 32, 61, kPerNode, nullptr, kHier},
    // The same two rows against pmoe with a relay that sums its node's rows, as DeepEP's does.
    {"DeepEP V2", "Combine (RDMA) vs node-summed", "h800-ib", 8, false, 8192, 16, 81, kPerNode,
     nullptr, kHier, true},
    {"DeepEP V2", "Combine (RDMA) vs node-summed", "h800-ib", 8, false, 8192, 32, 61, kPerNode,
     nullptr, kHier, true},
    {"DeepEP V2", "Dispatch (NVLink, SM100)", "gb200-nvl72", 8, true, 8192, 8, 726, kPerRank},
    {"DeepEP V2", "Combine (NVLink, SM100)", "gb200-nvl72", 8, false, 8192, 8, 740, kPerRank},
};

// The expected number of distinct groups (nodes or ranks) of `groups` equal groups of experts
// that a token's k distinct experts, drawn uniformly from E, fall into.
double distinct_groups(int experts, int topk, int groups) {
  const int per_group = experts / groups;
  double none_in_group = 1;  // C(E - per_group, k) / C(E, k)
  for (int i = 0; i < topk; ++i) none_in_group *= double(experts - per_group - i) / (experts - i);
  return groups * (1 - none_in_group);
}

// The published figure in µs: a bandwidth row divided back into the bytes its benchmark divides
// by, for uniform routing: rows of H x dtype (+ 4 B per 128 elements for fp8's scales, as
// DeepEP counts them), per selection (tokens x k), per (token, node) or per (token, rank).
double published_us(const PublishedRow& p, const ModelShape& s) {
  if (p.figure == Figure::us) return p.value;
  const std::string dtype = p.dispatch ? (p.dtype ? p.dtype : s.dtype) : s.out_dtype;
  const DType t = parse_dtype(dtype);
  const double row =
      double(s.hidden) * dtype_size(t) + (t == DType::f8e4m3 ? 4.0 * s.hidden / 128 : 0);
  const int experts = std::max(s.experts, p.ranks);
  double rows = double(p.tokens) * s.topk;
  if (p.figure == Figure::gbps_per_node)
    rows = p.tokens * distinct_groups(experts, s.topk, p.ranks / p.ranks_per_node);
  if (p.figure == Figure::gbps_per_rank)
    rows = p.tokens * distinct_groups(experts, s.topk, p.ranks);
  return rows * row / (p.value * 1e3);
}

// The term of pmoe's predicted time that weighs most: where pmoe is predicted slower than a
// published row, the term that loses.
const char* largest_term(const OpPrediction& o) {
  const std::pair<double, const char*> terms[] = {{o.launch_us, "launch"},
                                                  {o.latency_us, "latency"},
                                                  {o.bandwidth_us, "bandwidth"},
                                                  {o.transfer_us, "per-transfer"},
                                                  {o.local_us, "local"}};
  return std::max_element(std::begin(terms), std::end(terms))->second;
}

void run(const ModelShape& shape, uint64_t seed, const std::string& json_path) {
  json rows = json::array();
  std::printf(
      "## pmoe-bench model published: pmoe's protocol predicted on each published row's "
      "hardware (uniform routing, E=%d, top-k=%d, H=%d, %s dispatch unless the row says, %s "
      "combine); commit %s\n\n",
      shape.experts, shape.topk, shape.hidden, shape.dtype.c_str(), shape.out_dtype.c_str(),
      git_commit().c_str());
  std::printf(
      "| source | row | tokens | EP | preset, ranks/node | mode, dispatch dtype | published | "
      "published µs | predicted µs | predicted/published | largest term: launch / latency / "
      "bandwidth / per-transfer / local µs |\n"
      "|---|---|---:|---:|---|---|---:|---:|---:|---:|---|\n");
  double worst = 1;
  const PublishedRow* worst_row = nullptr;
  std::vector<std::pair<std::string, int>> per_source;
  for (const PublishedRow& p : kPublished) {
    ModelShape s = shape;
    if (p.dtype) s.dtype = p.dtype;
    const HardwarePreset hw = find_preset(p.preset);
    const ModelRow r = model_row(s, hw, p.ranks, p.ranks_per_node, p.tokens, p.mode, "uniform",
                                 seed, p.relay_reduces);
    const OpPrediction& o = p.dispatch ? r.prediction.dispatch : r.prediction.combine;
    const double published = published_us(p, s);
    const double ratio = o.us / published;
    // The worst ratio is the one furthest from 1 either way.
    if (!worst_row || std::abs(std::log(ratio)) > std::abs(std::log(worst)))
      worst = ratio, worst_row = &p;
    if (per_source.empty() || per_source.back().first != p.source)
      per_source.push_back({p.source, 0});
    ++per_source.back().second;
    const std::string figure =
        p.figure == Figure::us ? format("%.1f µs", p.value) : format("%.1f GB/s", p.value);
    std::printf(
        "| %s | %s | %d | %d | %s, %d | %s, %s | %s | %.1f | %.1f | %.2f | %s: %.1f / %.1f / "
        "%.1f / %.1f / %.1f |\n",
        p.source, p.row, p.tokens, p.ranks, p.preset, p.ranks_per_node,
        p.relay_reduces ? "hierarchical + relay sums" : detail::mode_name(p.mode), s.dtype.c_str(),
        figure.c_str(), published, o.us, ratio, largest_term(o), o.launch_us, o.latency_us,
        o.bandwidth_us, o.transfer_us, o.local_us);
    rows.push_back({{"source", p.source},
                    {"row", p.row},
                    {"tokens", p.tokens},
                    {"ranks", p.ranks},
                    {"preset", p.preset},
                    {"ranks_per_node", p.ranks_per_node},
                    {"mode", detail::mode_name(p.mode)},
                    {"relay_reduces", p.relay_reduces},
                    {"dtype", s.dtype},
                    {"published", p.value},
                    {"published_unit", p.figure == Figure::us ? "us" : "GB/s"},
                    {"published_us", published},
                    {"predicted_us", o.us},
                    {"ratio", ratio},
                    {"largest_term", largest_term(o)},
                    {"launch_us", o.launch_us},
                    {"latency_us", o.latency_us},
                    {"bandwidth_us", o.bandwidth_us},
                    {"transfer_us", o.transfer_us},
                    {"local_us", o.local_us}});
  }
  std::printf("\nrows per source:");
  for (const auto& [source, n] : per_source) std::printf(" %s %d,", source.c_str(), n);
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
      "published",
      "predicted / published for the published rows of pplx-kernels, DeepEP, TRT-LLM, "
      "pplx-garden, UCCL-EP and NCCL EP");
  add_shape_options(cmd, *shape);
  cmd->add_option("--seed", *seed, "routing seed")->capture_default_str();
  cmd->add_option("--json", *json_path, "write the rows as JSON to this file");
  cmd->callback([=] { run(*shape, *seed, *json_path); });
}

}  // namespace pmoe::bench
