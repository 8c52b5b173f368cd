// The scaling model's link model: named hardware presets (bandwidth, latency, per-transfer cost
// per link kind, local memory bandwidth, kernel launch cost) and the time they give to the byte
// counts of src/all_to_all/traffic.hpp. Host code only; the sources of every preset value are in
// docs/scaling-model.md.
//
// Time of one op on rank r (the op's time is the slowest rank's, the critical path):
//   launch:   kernels_per_op x launch_us
//   exchange: per link kind l, (latency_l if r uses l) + max(sent, received bytes) / gbps_l
//             + max(sent, received transfers) x per_transfer_us_l; direct mode: the link kinds
//             run at once (the max over l); hierarchical dispatch (and combine with
//             relay_reduces): the network stage, then the node stage (load/store and same rank
//             at once), one after the other; hierarchical combine returns rows directly, as
//             direct does
//   local:    rows x (row bytes) x 2 / local_gbps: landing rows into expert_x (dispatch) or
//             reading them for the sum (combine), read and written once
// The CPU presets (thread ranks on `cores` cores) use the CPU backend's own path instead, see
// predict_cpu.
#pragma once

#include <array>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "all_to_all/traffic.hpp"

namespace pmoe::bench {

struct LinkParams {
  double gbps = 0;             // GB/s per direction per rank
  double latency_us = 0;       // first byte to visible at the receiver, signal included
  double per_transfer_us = 0;  // issue cost per transfer beyond bandwidth (1 / message rate)
};

struct HardwarePreset {
  std::string name, description;
  int ranks_per_node = 8;
  std::array<LinkParams, detail::kLinkKinds> links;  // same_rank, load_store, network
  double local_gbps = 0;                             // device memory, read + write
  double launch_us = 0;                              // per kernel
  int kernels_per_op = 2;
  // CPU presets: the CPU backend's costs (see predict_cpu); 0 cores for GPU presets.
  int cores = 0;
  double call_us = 0;      // one rank's fixed cost per call, 1 token, 1 rank
  double signal_us = 0;    // one signal's round trip between two ranks
  double cache_gbps = 0;   // per-core copy bandwidth when the copy fits in cache_bytes
  double cache_bytes = 0;  // one core's cache (L2): smaller copies run at cache_gbps
  // Combine's sum on one core (rows read, converted, weighted, added; y written), GB/s of those
  // bytes, measured on one rank past the cache; 0: the copy bandwidth.
  double reduce_gbps = 0;
  nlohmann::json to_json() const;
  static HardwarePreset from_json(const nlohmann::json& j);
};

// The built-in presets by name; throws pmoe::Error listing the names on an unknown one.
const std::vector<HardwarePreset>& builtin_presets();
HardwarePreset find_preset(const std::string& name);
// A preset file written by `pmoe-bench model calibrate`.
HardwarePreset load_preset(const std::string& path);

struct OpPrediction {
  double us = 0;
  int critical_rank = 0;
  double launch_us = 0, exchange_us = 0, local_us = 0;  // the critical rank's parts
  // exchange_us's own terms, summed over the links on its path (direct: the slowest link kind;
  // staged: the network stage plus the slower node link): link latency, bytes / bandwidth and
  // transfers x per-transfer cost. They add up to exchange_us; `model published` names the
  // largest term where pmoe is predicted slower than a published row.
  double latency_us = 0, bandwidth_us = 0, transfer_us = 0;
};

struct Prediction {
  OpPrediction dispatch, combine;
};

// row_bytes: a dispatch slot's payload + scales, and a combine row (H x out dtype).
// relay_reduces: the traffic was counted with it (hierarchical combine summed by the relays,
// AllToAllConfig::combine_sums_in_node).
Prediction predict(const HardwarePreset& hw, const detail::Traffic& traffic,
                   detail::TrafficMode mode, double dispatch_row_bytes, double combine_row_bytes,
                   bool relay_reduces = false);

// The CPU backend with in-place buffers (src/cpu/all_to_all.cpp): dispatch sends headers, each
// receiver copies its rows from the source's input buffer (read + write); combine sends row
// refs, each source reads its rows in place and writes y. With W thread ranks on `cores` cores
// the work of all ranks shares the cores:
//   t = call_us x max(1, W / cores) + sync + max(max_r bytes_r, sum_r bytes_r / cores) / gbps
//   sync: W <= cores: one signal round trip (the sources signal at once, each on its own core);
//         W > cores: W x signal_us x W / cores (every rank waits for W signals, and a rank off
//         its core must be scheduled before it signals)
//   gbps: one core's copy bandwidth with every core copying (load_store), or cache_gbps when a
//         core's share of the bytes fits in cache_bytes; combine past the cache: reduce_gbps
//         (its sum is not a copy: it converts, weighs and adds every element)
Prediction predict_cpu(const HardwarePreset& hw, const detail::Traffic& traffic,
                       double dispatch_row_bytes, double combine_row_bytes, int tokens_per_rank,
                       double y_row_bytes);

}  // namespace pmoe::bench
