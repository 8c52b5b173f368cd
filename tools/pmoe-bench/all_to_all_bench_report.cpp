// `pmoe-bench all-to-all`'s report: the markdown tables of its rows (time per op and rank count,
// bandwidth against the copy roofline), and for --device cuda each rank's traffic per link and
// the emulated device's counts of each kernel, with the kernel model's prediction where --gpu
// names a GPU.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "all_to_all_bench.hpp"
#include "all_to_all_cuda.hpp"
#include "kernel_model.hpp"
#include "pmoe/diagnostics/kernel_counts.hpp"
#include "pmoe/error.hpp"
#include "report.hpp"

namespace pmoe::bench::all_to_all_bench {
namespace {

std::string cell(const json& row) {
  if (row["mean_us"].is_null()) return "not run";
  return format("%.1f", row["mean_us"].get<double>()) + " ± " +
         format("%.1f", row["std_us"].get<double>());
}

}  // namespace

json print_op_counts(const char* op, const std::vector<KernelCounts>& counts, int ranks, int tokens,
                     double min_bytes, const std::string& gpus) {
  std::printf(
      "\n%s, %d rank(s), %d tokens per rank: one call on every rank, counted on the "
      "emulated device (critical path: the most of any launch, block or thread; bytes: every "
      "rank's launches)\n\n",
      op, ranks, tokens);
  std::printf(
      "| kernel | launches | grid | barrier rounds | blocks waiting on own grid | "
      "blocks that spun | serial steps | bytes read | bytes written | system fences |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  json kernels = json::array();
  int64_t moved = 0;
  for (const KernelCounts& k : counts) {
    std::printf("| %s | %d | %u | %d | %d | %d | %lld | %lld | %lld | %d |\n", k.kernel.c_str(),
                k.launches, k.blocks, k.barrier_rounds, k.blocks_waiting_on_own_grid,
                k.blocks_that_spun, (long long)k.serial_steps, (long long)k.total_bytes_read,
                (long long)k.total_bytes_written, k.system_fences);
    moved += k.total_bytes_read + k.total_bytes_written;
    kernels.push_back({{"kernel", k.kernel},
                       {"launches", k.launches},
                       {"grid", k.blocks},
                       {"barrier_rounds", k.barrier_rounds},
                       {"blocks_waiting_on_own_grid", k.blocks_waiting_on_own_grid},
                       {"blocks_that_spun", k.blocks_that_spun},
                       {"serial_steps", k.serial_steps},
                       {"bytes_read", k.bytes_read},
                       {"bytes_written", k.bytes_written},
                       {"total_bytes_read", k.total_bytes_read},
                       {"total_bytes_written", k.total_bytes_written},
                       {"system_fences", k.system_fences}});
  }
  const double ratio = min_bytes > 0 ? double(moved) / min_bytes : 0.0;
  std::printf(
      "\n%s moved %lld bytes (read + written, all ranks) against the %.0f it must move: "
      "%.2fx the minimum\n",
      op, (long long)moved, min_bytes, ratio);
  json out = {{"kernels", kernels},
              {"bytes_moved", moved},
              {"bytes_min", min_bytes},
              {"bytes_over_min", ratio}};
  for (const std::string& name : split_names(gpus)) {
    const GpuSpec& g = find_gpu(name);
    const OpPrediction p = predict_op(g, counts, ranks);
    std::printf(
        "\nKernel model (tools/pmoe-bench/kernel_model.hpp), %s, the %d rank(s) sharing "
        "it: µs per call\n\n| kernel | launches a rank | waves | launch | rounds | steps | "
        "bytes | fences | peer wait | total |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        g.description.c_str(), ranks);
    json predicted = json::array();
    for (const KernelPrediction& k : p.kernels) {
      std::printf("| %s | %.0f | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
                  k.kernel.c_str(), k.launches_per_call, k.waves, k.launch_us, k.rounds_us,
                  k.steps_us, k.bytes_us, k.fences_us, k.wait_us, k.total_us);
      predicted.push_back({{"kernel", k.kernel},
                           {"launches_per_call", k.launches_per_call},
                           {"waves", k.waves},
                           {"launch_us", k.launch_us},
                           {"rounds_us", k.rounds_us},
                           {"steps_us", k.steps_us},
                           {"bytes_us", k.bytes_us},
                           {"fences_us", k.fences_us},
                           {"wait_us", k.wait_us},
                           {"total_us", k.total_us}});
    }
    const double copy = copy_us(g, min_bytes / 2);  // a copy moving the op's minimum (r + w)
    std::printf(
        "\n%s predicted on %s: %.1f µs of kernels (a graph replay), %.1f µs with the "
        "host's launches; a copy of its minimum bytes: %.1f µs (fraction of a copy %.2f)\n",
        op, g.name.c_str(), p.kernel_us, p.host_us, copy, copy / p.kernel_us);
    out["predicted"][g.name] = {{"kernel_us", p.kernel_us},
                                {"host_us", p.host_us},
                                {"copy_us", copy},
                                {"copy_fraction", copy / p.kernel_us},
                                {"kernels", predicted}};
  }
  return out;
}

json links_json(const std::vector<CudaAllToAllResult::RankLinks>& ranks) {
  using detail::Link;
  json out = json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto& [measured, counted] = ranks[r];
    auto counted_link = [&](Link l) {
      return json{{"bytes", counted.sent[int(l)].bytes},
                  {"transfers", counted.sent[int(l)].transfers},
                  {"signals", counted.signals_sent[int(l)]},
                  {"received_bytes", counted.received[int(l)].bytes}};
    };
    const detail::LinkCount& net = counted.sent[int(Link::network)];
    out.push_back({{"rank", r},
                   {"network_measured", {{"bytes", measured.bytes},
                                         {"transfers", measured.transfers}}},
                   {"network_counted", counted_link(Link::network)},
                   {"load_store_counted", counted_link(Link::load_store)},
                   {"same_rank_counted", counted_link(Link::same_rank)},
                   {"rows", counted.rows},
                   {"network_matches_count",
                    measured.bytes == net.bytes && measured.transfers == net.transfers}});
  }
  return out;
}

void print_tables(const Options& o, const json& rows) {
  std::printf("\n## pmoe-bench all-to-all: E=%d, top-k=%d, H=%d, %s (combine out bf16)\n\n",
              o.experts, o.topk, o.hidden, o.dtype.c_str());
  std::printf(
      "%d timed iterations after %d warm-ups; an iteration's time is the slowest rank's. %s\n",
      o.iters, o.warmup,
      o.device == "cuda"
          ? (std::string(o.in_place ? "dispatch/combine run on the op's in-place buffers "
                                      "(AllToAll::input_buffer(), expert_output_buffer()), as an "
                                      "MoE layer runs them"
                                    : "dispatch/combine run on the caller's own device buffers "
                                      "(--no-in-place)") +
             ". Times: dispatch and combine are the kernels' time, events around a replay of "
             "the op captured once per rank in a CUDA graph; dispatch_host and combine_host are "
             "events recorded before the host's launches (with ranks sharing a GPU the slowest "
             "rank's then includes the other ranks' launches); dispatch_send/recv and "
             "combine_send/recv the split phases, from the host. dispatch_combine is the round "
             "trip (graph replays), and nccl_alltoallv NCCL's all-to-all-v of the same rows, "
             "also a round trip.").c_str()
          : "dispatch/combine use the op's in-place buffers; *_staged the caller's own; "
            "dispatch_combine, alltoallv and dense_padded are round trips.");
  std::vector<int> rank_counts, token_counts;
  std::vector<std::string> ops;
  for (const auto& r : rows) {
    auto add_unique = [](auto& v, auto x) { if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x); };
    add_unique(rank_counts, r["ranks"].get<int>());
    add_unique(token_counts, r["tokens"].get<int>());
    add_unique(ops, r["op"].get<std::string>());
  }
  for (int tokens : token_counts) {
    std::printf("\n### %d token%s per rank: mean ± std (µs)\n\n| op |", tokens, tokens == 1 ? "" : "s");
    for (int W : rank_counts) std::printf(" EP%d |", W);
    std::printf("\n|---|");
    for (size_t i = 0; i < rank_counts.size(); ++i) std::printf("---:|");
    std::printf("\n");
    for (const auto& op : ops) {
      std::printf("| %s |", op.c_str());
      for (int W : rank_counts) {
        std::string text = "x";
        for (const auto& r : rows)
          if (r["op"] == op && r["ranks"] == W && r["tokens"] == tokens) text = cell(r);
        std::printf(" %s |", text.c_str());
      }
      std::printf("\n");
    }
  }
  std::vector<std::string> told;  // why a row did not run, said once, with the first such row
  for (const auto& r : rows) {
    if (!r.contains("not_run")) continue;
    const std::string why = r["not_run"];
    if (std::find(told.begin(), told.end(), why) != told.end()) continue;
    told.push_back(why);
    std::printf("\n%s (first at EP%d, %d tokens): %s\n", r["op"].get<std::string>().c_str(),
                r["ranks"].get<int>(), r["tokens"].get<int>(), why.c_str());
  }
  const bool roofline = std::any_of(rows.begin(), rows.end(),
                                    [](const json& r) { return r["copy_gbps"].get<double>() > 0; });
  if (!roofline) return;  // the emulated CUDA device: its times say nothing about bandwidth
  std::printf("\n### Bandwidth against the memory-copy roofline (copy GB/s: per rank, all ranks "
              "copying at once as many bytes as the op moves, in the ops' own loop, in turns with their timed "
              "iterations)\n\n");
  for (const auto& r : rows)
    if (r.contains("copy_kind") && r["op"] == "dispatch")
      std::printf("- %d ranks, %d tokens: the roofline is a %s\n", r["ranks"].get<int>(),
                  r["tokens"].get<int>(), r["copy_kind"].get<std::string>().c_str());
  auto fraction = [](const json& r) {
    return r["copy_fraction"].is_null() ? std::string("") : format("%.2f", r["copy_fraction"].get<double>());
  };
  auto gbps = [](const json& r) {
    return r["gbps"].is_null() ? std::string("") : format("%.2f", r["gbps"].get<double>());
  };
  auto workspace = [](const json& r) {
    return r["workspace_bytes"].is_null()
               ? std::string("")
               : format("%.1f", r["workspace_bytes"].get<double>() / double(1 << 20));
  };
  print_markdown({column("op", "op"), column("ranks", "ranks"), column("tokens", "tokens"),
                  {"mean ± std (µs)", cell}, {"GB/s", gbps}, column("copy GB/s", "copy_gbps", "%.2f"),
                  {"of copy bw", fraction},
                  {"workspace/rank (MiB)", workspace}},
                 rows);
}

// --device cuda: per op, per rank, the bytes and transfers each link carried.
void print_links(const json& rows) {
  for (const auto& row : rows) {
    if (!row.contains("per_rank")) continue;
    std::printf("\n### %s, %d ranks (nodes x ranks per node: %s), %d token%s per rank, mode %s: sent per "
                "rank and link\n\nnetwork: measured (the remote path's counters, one call); "
                "load/store and same rank: counted (count_traffic of the same routing; stores "
                "leave no counter)\n\n",
                row["op"].get<std::string>().c_str(), row["ranks"].get<int>(),
                row["split"].get<std::string>().c_str(), row["tokens"].get<int>(),
                row["tokens"] == 1 ? "" : "s", row["mode"].get<std::string>().c_str());
    std::printf("| rank | network bytes (measured) | network transfers (measured) | = counted | "
                "load/store bytes (counted) | load/store transfers (counted) | same-rank bytes "
                "(counted) | same-rank transfers (counted) | signals network / load/store / "
                "same rank (counted) |\n|---:|---:|---:|---|---:|---:|---:|---:|---|\n");
    int differ = 0;
    for (const auto& r : row["per_rank"]) {
      const json &net = r["network_measured"], &ls = r["load_store_counted"],
                 &same = r["same_rank_counted"];
      const bool match = r["network_matches_count"].get<bool>();
      differ += !match;
      std::printf("| %d | %llu | %llu | %s | %llu | %llu | %llu | %llu | %llu / %llu / %llu |\n",
                  r["rank"].get<int>(), net["bytes"].get<unsigned long long>(),
                  net["transfers"].get<unsigned long long>(),
                  match ? "yes"
                        : detail::cat("NO: ", r["network_counted"]["bytes"].get<uint64_t>(),
                                      " in ", r["network_counted"]["transfers"].get<uint64_t>())
                              .c_str(),
                  ls["bytes"].get<unsigned long long>(), ls["transfers"].get<unsigned long long>(),
                  same["bytes"].get<unsigned long long>(),
                  same["transfers"].get<unsigned long long>(),
                  r["network_counted"]["signals"].get<unsigned long long>(),
                  ls["signals"].get<unsigned long long>(), same["signals"].get<unsigned long long>());
    }
    if (differ)
      std::printf("\nThe measured network traffic differs from count_traffic on %d rank%s.\n",
                  differ, differ == 1 ? "" : "s");
  }
}

// The targets, where the run has their configuration (2 ranks, 128 tokens).
void print_targets(const json& rows) {
  auto find = [&](const char* op) -> const json* {
    for (const auto& r : rows)
      if (r["op"] == op && r["ranks"] == 2 && r["tokens"] == 128) return &r;
    return nullptr;
  };
  const json *d = find("dispatch"), *c = find("combine"), *dc = find("dispatch_combine"),
             *v = find("alltoallv"), *p = find("dense_padded");
  if (!d || !c || !dc || !v || !p) return;
  const double mean = (*dc)["mean_us"].get<double>();
  auto line = [](const char* what, double value, double goal) {
    std::printf("- %s: %.2f (target >= %.2f): %s\n", what, value, goal, value >= goal ? "met" : "NOT met");
  };
  std::printf("\n### Targets at 2 ranks, 128 tokens\n\n");
  line("alltoallv time / pmoe dispatch+combine time", (*v)["mean_us"].get<double>() / mean, 2.0);
  line("dense_padded time / pmoe dispatch+combine time", (*p)["mean_us"].get<double>() / mean, 5.0);
  line("dispatch, fraction of the copy bound", (*d)["copy_fraction"].get<double>(), 0.6);
  line("combine, fraction of the copy bound", (*c)["copy_fraction"].get<double>(), 0.6);
}

}  // namespace pmoe::bench::all_to_all_bench
