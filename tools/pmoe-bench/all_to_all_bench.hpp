// What the files of `pmoe-bench all-to-all` share: its options, the rows it reports, and what each
// file gives the others. all_to_all_bench.cpp holds the command line and the sweep (and says what
// is measured), all_to_all_bench_cpu.cpp the CPU backend's run of one configuration against its
// copy roofline, all_to_all_bench_report.cpp the tables and the rows' per-rank and per-kernel
// details.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "all_to_all_cuda.hpp"
#include "bench_common.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/diagnostics/kernel_counts.hpp"

namespace pmoe::bench::all_to_all_bench {

using nlohmann::json;

struct Options {
  std::string ranks = "2,4,8";
  std::string tokens = "1,128";
  int experts = 256;
  int topk = 8;
  int hidden = 7168;
  std::string dtype = "bf16";
  int iters = 20;
  int warmup = 3;
  uint64_t seed = 1;
  bool staged = true;
  bool rank_mask = false;  // also time a twin op made with rank_mask, in turns with the plain one
  std::string on_peer_loss = "fail";  // mask: the twin is made with on_peer_loss = mask instead
  std::string device = "cpu";  // or "cuda": ranks share GPU 0
  int ranks_per_node = 0;       // 0: one node; else the ranks as nodes of this many
  std::string mode = "direct";  // how tokens cross nodes: direct or hierarchical (CUDA only)
  bool in_place = true;    // --device cuda: the op's in-place buffers (--no-in-place: the caller's)
  std::string gpu;         // --device cuda on the emulated device: the kernel model's GPU, or none
  std::string json_path, csv_path, plot_path;
  bool ranks_given = false;  // --ranks on the command line (under mpirun it must match)
};

AllToAllConfig config_for(const Options& o, int tokens);

std::vector<double> sum_of(const std::vector<double>& a, const std::vector<double>& b);

struct Context {
  const Options& o;
  int W, tokens;
  double copy_gbps;
  json rows = json::array();

  // copy: this row's roofline (copy_gbps, per rank), where it has its own.
  void add(const std::string& op, const std::vector<double>& us, double bytes,
           size_t workspace, std::optional<double> copy = std::nullopt) {
    const double copy_gbps = copy.value_or(this->copy_gbps);
    const Stats s = summarize(us);
    json row = {{"op", op},           {"ranks", W},          {"tokens", tokens},
                {"mean_us", s.mean},  {"std_us", s.std},     {"min_us", s.min},
                {"median_us", s.median}, {"max_us", s.max},  {"copy_gbps", copy_gbps}};
    if (bytes > 0) {
      row["gbps"] = bytes / (s.mean * 1e3);
      // No roofline on the emulated CUDA device (copy_gbps 0): its times are not GPU times.
      row["copy_fraction"] = copy_gbps > 0 ? json(bytes / (s.mean * 1e3) / copy_gbps) : json(nullptr);
    } else {
      row["gbps"] = nullptr;
      row["copy_fraction"] = nullptr;
    }
    row["workspace_bytes"] = workspace ? json(workspace) : json(nullptr);
    rows.push_back(row);
  }

  // A baseline that could not run here: its row says why instead of a time.
  void add_not_run(const std::string& op, const std::string& why) {
    json row = {{"op", op}, {"ranks", W}, {"tokens", tokens}, {"copy_gbps", copy_gbps},
                {"not_run", why}};
    for (const char* key : {"mean_us", "std_us", "min_us", "median_us", "max_us", "gbps",
                            "copy_fraction", "workspace_bytes"})
      row[key] = nullptr;
    rows.push_back(row);
  }
};

// The CPU backend (all_to_all_bench_cpu.cpp): checks pmoe's AllToAll and the baselines against the
// reference on `comm`'s ranks, then times them and the copy roofline, adding their rows to `ctx`.
void run_config(Communicator& comm, Context& ctx);

// The emulated device's counts of one call of an op on every rank (include/pmoe/diagnostics/kernel_counts.hpp),
// printed since the emulated device cannot time anything, with the bytes the op moved (read +
// written, every rank's kernels) beside the minimum it must move (`min_bytes`, every rank's), and,
// where --gpu names one, the kernel model's µs for that GPU (kernel_model.hpp). Kept in the JSON
// rows. The budgets the counts are held to are docs/gpu-all-to-all.md's.
json print_op_counts(const char* op, const std::vector<KernelCounts>& counts, int ranks, int tokens,
                     double min_bytes, const std::string& gpus);

// Per rank and link: the network as measured by the remote path (remote_traffic() around one
// call), and count_traffic's counts of every link for the same routing. matches: the measured
// network equals the count.
json links_json(const std::vector<CudaAllToAllResult::RankLinks>& ranks);

// The report of the rows (all_to_all_bench_report.cpp): the time of every op, the bandwidth
// against the roofline, the links' traffic (--device cuda), and the targets.
void print_tables(const Options& o, const json& rows);
void print_links(const json& rows);
void print_targets(const json& rows);

}  // namespace pmoe::bench::all_to_all_bench
