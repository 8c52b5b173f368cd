// Hardware presets and the link model; the formulas are at the top of model_links.hpp, the
// sources of the numbers in docs/scaling-model.md ("spec" = vendor specification, "estimate" =
// not from a spec, said so there).
#include "model_links.hpp"

#include <algorithm>
#include <fstream>

#include "pmoe/error.hpp"

namespace pmoe::bench {

using detail::Link;
using nlohmann::json;

namespace {

constexpr int kSame = int(Link::same_rank), kLoadStore = int(Link::load_store),
              kNetwork = int(Link::network);

// One GPU with HBM at `hbm` GB/s (a copy to its own memory reads and writes: half of it),
// `nvlink` GB/s per direction inside a node of `per_node` GPUs, a NIC of `nic` GB/s.
HardwarePreset gpu(std::string name, std::string description, int per_node, double hbm,
                   double nvlink, double nic, double nic_latency_us, double per_transfer_us) {
  HardwarePreset p;
  p.name = std::move(name);
  p.description = std::move(description);
  p.ranks_per_node = per_node;
  p.links[kSame] = {hbm / 2, 0.0, 0.0};
  p.links[kLoadStore] = {nvlink, 1.0, 0.0};  // latency: estimate
  p.links[kNetwork] = {nic, nic_latency_us, per_transfer_us};
  p.local_gbps = hbm;
  p.launch_us = 3.0;  // estimate: a CUDA kernel launch, a few µs
  p.kernels_per_op = 2;
  return p;
}

}  // namespace

const std::vector<HardwarePreset>& builtin_presets() {
  static const std::vector<HardwarePreset> presets = {
      gpu("h100-ib",
          "H100 SXM5 (HBM3 3.35 TB/s), NVLink 4 (450 GB/s per direction), 8 per node, "
          "ConnectX-7 400 Gb/s InfiniBand per GPU, GPU-initiated RDMA (IBGDA)",
          8, 3350, 450, 50, 2.0, 0.003),
      gpu("h100-ibrc",
          "h100-ib with RDMA posted by a CPU proxy thread (NVSHMEM IBRC): higher latency and "
          "per-transfer cost (estimates)",
          8, 3350, 450, 50, 5.0, 0.5),
      gpu("h200-ib", "H200 (HBM3e 4.8 TB/s), otherwise h100-ib", 8, 4800, 450, 50, 2.0, 0.003),
      gpu("h800-ib",
          "H800 (HBM3 3.35 TB/s, NVLink 200 GB/s per direction), 8 per node, ConnectX-7 400 "
          "Gb/s per GPU (DeepEP's published machine)",
          8, 3350, 200, 50, 2.0, 0.003),
      gpu("gb200-nvl72",
          "GB200 NVL72: B200 (HBM3e 8 TB/s), NVLink 5 (900 GB/s per direction), 72 GPUs in one "
          "NVLink domain, ConnectX-8 800 Gb/s per GPU",
          72, 8000, 900, 100, 2.0, 0.003),
      gpu("aws-efa-p5",
          "AWS p5.48xlarge: 8 H100 with NVLink 4, EFA 3200 Gb/s per instance (400 Gb/s per "
          "GPU), transfers posted by the host (latency and per-transfer cost: estimates)",
          8, 3350, 450, 50, 15.0, 1.0),
      gpu("aws-efa-p5en",
          "AWS p5en.48xlarge: 8 H200 (HBM3e 4.8 TB/s) with NVLink 4, 16 EFA NICs of 200 Gb/s "
          "(two per GPU, 400 Gb/s per GPU), transfers posted by the host (latency and "
          "per-transfer cost: the aws-efa-p5 estimates)",
          8, 4800, 450, 50, 15.0, 1.0),
  };
  return presets;
}

HardwarePreset find_preset(const std::string& name) {
  std::string names;
  for (const HardwarePreset& p : builtin_presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw Error(detail::cat("--preset: no preset '", name, "'; built in: ", names,
                          "; or a file written by `pmoe-bench model calibrate` (--preset-file)"));
}

json HardwarePreset::to_json() const {
  json links_json = json::object();
  for (int l = 0; l < detail::kLinkKinds; ++l)
    links_json[detail::link_name(Link(l))] = {{"gbps", links[l].gbps},
                                              {"latency_us", links[l].latency_us},
                                              {"per_transfer_us", links[l].per_transfer_us}};
  return {{"name", name},
          {"description", description},
          {"ranks_per_node", ranks_per_node},
          {"links", links_json},
          {"local_gbps", local_gbps},
          {"launch_us", launch_us},
          {"kernels_per_op", kernels_per_op},
          {"cores", cores},
          {"call_us", call_us},
          {"signal_us", signal_us},
          {"cache_gbps", cache_gbps},
          {"cache_bytes", cache_bytes},
          {"reduce_gbps", reduce_gbps}};
}

HardwarePreset HardwarePreset::from_json(const json& j) {
  HardwarePreset p;
  try {
    p.name = j.at("name").get<std::string>();
    p.description = j.value("description", "");
    p.ranks_per_node = j.at("ranks_per_node").get<int>();
    for (int l = 0; l < detail::kLinkKinds; ++l) {
      const json& link = j.at("links").at(detail::link_name(Link(l)));
      p.links[l] = {link.at("gbps").get<double>(), link.at("latency_us").get<double>(),
                    link.at("per_transfer_us").get<double>()};
    }
    p.local_gbps = j.at("local_gbps").get<double>();
    p.launch_us = j.at("launch_us").get<double>();
    p.kernels_per_op = j.at("kernels_per_op").get<int>();
    p.cores = j.value("cores", 0);
    p.call_us = j.value("call_us", 0.0);
    p.signal_us = j.value("signal_us", 0.0);
    p.cache_gbps = j.value("cache_gbps", 0.0);
    p.cache_bytes = j.value("cache_bytes", 0.0);
    p.reduce_gbps = j.value("reduce_gbps", 0.0);
  } catch (const json::exception& e) {
    throw Error(detail::cat("preset file: ", e.what()));
  }
  PMOE_CHECK(p.ranks_per_node >= 1 && p.links[kLoadStore].gbps > 0,
             "preset file: ranks_per_node >= 1 and a load_store bandwidth > 0 needed");
  return p;
}

HardwarePreset load_preset(const std::string& path) {
  std::ifstream in(path);
  PMOE_CHECK(in, "--preset-file: cannot read ", path);
  json j;
  try {
    in >> j;
  } catch (const json::exception& e) {
    throw Error(detail::cat("--preset-file ", path, ": ", e.what()));
  }
  return HardwarePreset::from_json(j);
}

namespace {

// One link kind's time on one rank, in its three terms (all 0 when the link is unused).
struct LinkTime {
  double latency_us = 0, bandwidth_us = 0, transfer_us = 0;
  double us() const { return latency_us + bandwidth_us + transfer_us; }
};

LinkTime link_time(const LinkParams& p, const detail::LinkCount& sent,
                   const detail::LinkCount& received) {
  if (sent.transfers == 0 && received.transfers == 0) return {};
  const double bytes = double(std::max(sent.bytes, received.bytes));
  const double transfers = double(std::max(sent.transfers, received.transfers));
  return {p.latency_us, bytes / (p.gbps * 1e3), transfers * p.per_transfer_us};
}

LinkTime slower(const LinkTime& a, const LinkTime& b) { return b.us() > a.us() ? b : a; }

// staged: the network stage, then the node stage (a relay forwards what it received); else the
// link kinds at once.
OpPrediction predict_op(const HardwarePreset& hw, const detail::OpTraffic& op, bool staged,
                        double row_bytes) {
  OpPrediction worst;
  for (int r = 0; r < int(op.ranks.size()); ++r) {
    const detail::RankTraffic& t = op.ranks[r];
    LinkTime per_link[detail::kLinkKinds];
    for (int l = 0; l < detail::kLinkKinds; ++l)
      per_link[l] = link_time(hw.links[l], t.sent[l], t.received[l]);
    const LinkTime node = slower(per_link[kSame], per_link[kLoadStore]);
    const LinkTime& net = per_link[kNetwork];
    const LinkTime path =
        staged ? LinkTime{node.latency_us + net.latency_us, node.bandwidth_us + net.bandwidth_us,
                          node.transfer_us + net.transfer_us}
               : slower(node, net);
    OpPrediction p;
    p.critical_rank = r;
    p.launch_us = hw.kernels_per_op * hw.launch_us;
    p.exchange_us = path.us();
    p.latency_us = path.latency_us;
    p.bandwidth_us = path.bandwidth_us;
    p.transfer_us = path.transfer_us;
    p.local_us = double(t.rows) * row_bytes * 2 / (hw.local_gbps * 1e3);
    p.us = p.launch_us + p.exchange_us + p.local_us;
    if (r == 0 || p.us > worst.us) worst = p;
  }
  return worst;
}

}  // namespace

Prediction predict(const HardwarePreset& hw, const detail::Traffic& traffic,
                   detail::TrafficMode mode, double dispatch_row_bytes, double combine_row_bytes,
                   bool relay_reduces) {
  const bool hierarchical = mode == detail::TrafficMode::hierarchical;
  return {predict_op(hw, traffic.dispatch, hierarchical, dispatch_row_bytes),
          predict_op(hw, traffic.combine, hierarchical && relay_reduces, combine_row_bytes)};
}

Prediction predict_cpu(const HardwarePreset& hw, const detail::Traffic& traffic,
                       double dispatch_row_bytes, double combine_row_bytes, int tokens_per_rank,
                       double y_row_bytes) {
  PMOE_CHECK(hw.cores >= 1, "preset ", hw.name, " is not a CPU preset (no cores)");
  const int W = int(traffic.dispatch.ranks.size());
  const double share = std::max(1.0, double(W) / hw.cores);
  const double sync = W <= hw.cores ? hw.signal_us : W * hw.signal_us * share;
  auto op = [&](const detail::OpTraffic& t, double per_row, double extra, double past_cache) {
    double most = 0, sum = 0;
    int critical = 0;
    for (int r = 0; r < W; ++r) {
      const double bytes = double(t.ranks[r].rows) * per_row + extra;
      if (bytes > most) most = bytes, critical = r;
      sum += bytes;
    }
    const double per_core = std::max(most, sum / hw.cores);
    const double gbps =
        hw.cache_gbps > 0 && per_core <= hw.cache_bytes ? hw.cache_gbps : past_cache;
    OpPrediction p;
    p.critical_rank = critical;
    p.launch_us = hw.call_us * share + sync;
    p.exchange_us = per_core / (gbps * 1e3);
    p.us = p.launch_us + p.exchange_us;
    return p;
  };
  const double copy = hw.links[kLoadStore].gbps;
  return {op(traffic.dispatch, 2 * dispatch_row_bytes, 0, copy),
          op(traffic.combine, combine_row_bytes, tokens_per_rank * y_row_bytes,
             hw.reduce_gbps > 0 ? hw.reduce_gbps : copy)};
}

}  // namespace pmoe::bench
