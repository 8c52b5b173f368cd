// `pmoe-bench all-to-all`: the dispatch/combine table of pplx-kernels' README, for pmoe, with
// its baselines and a roofline. For each rank count and tokens per rank, every path is first
// checked against the plain reference (a wrong result exits non-zero), then timed by the
// DESIGN.md protocol.
//
// An op's GB/s counts the bytes it must read and write, per rank (averaged over ranks):
//   dispatch: (tokens arriving + rows landed in expert_x) x (payload + scale bytes): every token
//             that crosses to the rank read once, every (token, local expert) row written once;
//   combine:  (rows summed) x (expert_y row bytes) read + (tokens) x (y row bytes) written;
//   round trips (pmoe dispatch+combine and the baselines): the sum of the two.
// copy_fraction = GB/s / copy_gbps: 1.0 would be an op as fast as memcpy of what it must move.
// The roofline, and how it is measured on the CPU: all_to_all_bench_cpu.cpp. The tables:
// all_to_all_bench_report.cpp.
//
// --device cuda: the dispatch and combine rows also carry the split ("nodes x ranks per node")
// and the mode, network_bytes_per_rank / network_transfers_per_rank (rank 0's, measured), and
// per_rank: for every rank, network_measured (AllToAll::remote_traffic() around one call) and
// network_counted / load_store_counted / same_rank_counted (count_traffic of the same routing:
// bytes, transfers and signals sent, bytes received), rows, and network_matches_count. Its
// baseline is the row nccl_alltoallv, NCCL's all-to-all-v of the same rows (nccl_all_to_all_v.hpp),
// a round trip like the CPU's alltoallv; where NCCL cannot run it (the emulated device, ranks that
// share one GPU, no libnccl) the row's times are null and not_run says why.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "all_to_all_bench.hpp"
#include "all_to_all_cuda.hpp"
#include "bench_common.hpp"
#include "core/device_runtime.hpp"
#include "kernel_model.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/error.hpp"
#include "report.hpp"
#include "subcommands.hpp"

namespace pmoe::bench {
namespace all_to_all_bench {

AllToAllConfig config_for(const Options& o, int tokens) {
  AllToAllConfig c;
  c.max_tokens = tokens;
  c.num_experts = o.experts;
  c.top_k = o.topk;
  c.hidden_dim = o.hidden;
  c.in_dtype = parse_dtype(o.dtype);
  PMOE_CHECK(c.in_dtype == DType::bf16 || c.in_dtype == DType::f8e4m3,
             "--dtype must be bf16 or f8e4m3, got ", o.dtype);
  c.scale_block = c.in_dtype == DType::f8e4m3 ? 128 : 0;
  c.out_dtype = DType::bf16;
  c.in_place_buffers = true;
  c.ranks_per_node = o.ranks_per_node;
  c.cross_node = o.mode == "hierarchical" ? CrossNode::hierarchical : CrossNode::direct;
  PMOE_CHECK(c.cross_node == CrossNode::direct || o.device == "cuda",
             "--mode hierarchical is a mode of the CUDA kernels: add --device cuda");
  c.validate(o.ranks_per_node > 0 ? o.ranks_per_node : 1);
  return c;
}

std::vector<double> sum_of(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

namespace {

detail::TrafficMode traffic_mode(const std::string& mode) {
  return mode == "hierarchical" ? detail::TrafficMode::hierarchical : detail::TrafficMode::direct;
}

void run(const Options& o) {
  PMOE_CHECK(o.iters >= 1 && o.warmup >= 0, "--iters must be >= 1 and --warmup >= 0");
  const std::vector<int> rank_counts =
      rank_counts_to_run(o.ranks_given, parse_int_list(o.ranks, "--ranks"));
  const std::vector<int> token_counts = parse_int_list(o.tokens, "--tokens");
  for (int tokens : token_counts) config_for(o, tokens);  // reject bad options before any work
  json rows = json::array();
  PMOE_CHECK(o.device == "cpu" || o.device == "cuda", "--device must be cpu or cuda, got ",
             o.device);
  if (!o.gpu.empty()) {
    for (const std::string& name : split_names(o.gpu)) find_gpu(name);  // refused before any work
    PMOE_CHECK(o.device == "cuda", "--gpu models the CUDA kernels' counts: add --device cuda");
  }
  if (o.device == "cuda") {
    if (cuda_emulated() && is_printing_rank())
      std::printf("CUDA runtime: the emulated device (no GPU visible, or PMOE_CUDA_EMULATE=1). "
                  "The results are checked against the reference as on a GPU, but the times are "
                  "emulation times, not GPU speed, and there is no roofline.\n\n");
    std::mutex mutex;
    auto run_cuda = [&](Communicator& comm) {
      for (int tokens : token_counts) {
        AllToAllConfig cfg = config_for(o, tokens);
        cfg.in_place_buffers = o.in_place;
        const CudaAllToAllResult r = run_all_to_all_cuda(comm, cfg, tokens, o.seed, o.warmup,
                                                         o.iters, traffic_mode(o.mode));
        json dispatch_counts, combine_counts;  // the emulated device's, printed by rank 0
        if (comm.rank() == 0 && !r.dispatch_counts.empty()) {
          std::lock_guard lock(mutex);
          const double W = comm.size();
          dispatch_counts = print_op_counts("dispatch", r.dispatch_counts, comm.size(), tokens,
                                            r.dispatch_bytes * W, o.gpu);
          combine_counts = print_op_counts("combine", r.combine_counts, comm.size(), tokens,
                                           r.combine_bytes * W, o.gpu);
        }
        Context ctx{o, comm.size(), tokens, r.copy_gbps};
        ctx.add("dispatch", r.dispatch_us, r.dispatch_bytes, r.workspace_bytes);
        ctx.rows.back()["network_bytes_per_rank"] = r.dispatch_network.bytes;
        ctx.rows.back()["network_transfers_per_rank"] = r.dispatch_network.transfers;
        ctx.rows.back()["per_rank"] = links_json(r.dispatch_links);
        if (!dispatch_counts.is_null()) ctx.rows.back()["kernel_counts"] = dispatch_counts;
        ctx.add("combine", r.combine_us, r.combine_bytes, r.workspace_bytes);
        ctx.rows.back()["network_bytes_per_rank"] = r.combine_network.bytes;
        ctx.rows.back()["network_transfers_per_rank"] = r.combine_network.transfers;
        ctx.rows.back()["per_rank"] = links_json(r.combine_links);
        if (!combine_counts.is_null()) ctx.rows.back()["kernel_counts"] = combine_counts;
        // The same ops timed from before the host's launches (the time all rows had before
        // graph replays).
        ctx.add("dispatch_host", r.dispatch_host_us, r.dispatch_bytes, r.workspace_bytes);
        ctx.add("combine_host", r.combine_host_us, r.combine_bytes, r.workspace_bytes);
        ctx.add("dispatch_combine", sum_of(r.dispatch_us, r.combine_us),
                r.dispatch_bytes + r.combine_bytes, r.workspace_bytes);
        ctx.add("dispatch_send", r.dispatch_send_us, 0, r.workspace_bytes);
        ctx.add("dispatch_recv", r.dispatch_recv_us, 0, r.workspace_bytes);
        ctx.add("combine_send", r.combine_send_us, 0, r.workspace_bytes);
        ctx.add("combine_recv", r.combine_recv_us, 0, r.workspace_bytes);
        // NCCL's all-to-all-v of the same rows, a round trip like the CPU's alltoallv row.
        if (r.nccl_not_run.empty())
          ctx.add("nccl_alltoallv", r.nccl_us, r.dispatch_bytes + r.combine_bytes, 0);
        else
          ctx.add_not_run("nccl_alltoallv", r.nccl_not_run);
        const int per_node = o.ranks_per_node > 0 ? o.ranks_per_node : comm.size();
        for (auto& row : ctx.rows) {
          row["copy_kind"] = r.copy_kind;
          row["ranks_per_node"] = per_node;
          row["split"] = detail::cat(comm.size() / per_node, "x", per_node);
          row["mode"] = o.mode;
          row["in_place"] = r.in_place;
        }
        if (o.ranks_per_node > 0 && comm.rank() == 0)
          std::printf("ranks=%d split=%dx%d tokens=%d mode=%s: network bytes per rank (rank 0) "
                      "dispatch %llu in %llu transfers, combine %llu in %llu transfers%s\n",
                      comm.size(), comm.size() / o.ranks_per_node, o.ranks_per_node, tokens,
                      o.mode.c_str(), (unsigned long long)r.dispatch_network.bytes,
                      (unsigned long long)r.dispatch_network.transfers,
                      (unsigned long long)r.combine_network.bytes,
                      (unsigned long long)r.combine_network.transfers,
                      cuda_emulated() ? " (times: emulation)" : "");
        if (comm.rank() == 0) {
          std::lock_guard lock(mutex);
          for (auto& row : ctx.rows) rows.push_back(row);
        }
      }
    };
    for (int W : rank_counts) run_on_ranks(launched_by_mpi() ? 0 : W, run_cuda, Device::cuda(0));
  }
  for (int W : o.device == "cuda" ? std::vector<int>{} : rank_counts) {
    std::mutex mutex;
    run_on_ranks(launched_by_mpi() ? 0 : W, [&](Communicator& comm) {
      for (int tokens : token_counts) {
        Context ctx{o, comm.size(), tokens, 0.0};  // run_config measures the rooflines
        run_config(comm, ctx);
        if (comm.rank() == 0) {
          std::lock_guard lock(mutex);
          for (auto& r : ctx.rows) rows.push_back(r);
        }
      }
    });
  }
  if (!is_printing_rank()) return;
  print_tables(o, rows);
  print_links(rows);
  print_targets(rows);
  json copy_json = json::object();  // "ranks x tokens" -> op -> the copy bandwidth measured for it
  for (const auto& r : rows)
    copy_json[std::to_string(r["ranks"].get<int>()) + "x" + std::to_string(r["tokens"].get<int>())]
             [r["op"].get<std::string>()] = r["copy_gbps"];
  const std::string runtime = o.device == "cpu" ? "cpu"
                              : cuda_emulated() ? "emulated CUDA (not GPU speed)"
                                                : "CUDA";
  const json config = {{"device", o.device}, {"runtime", runtime}, {"experts", o.experts}, {"topk", o.topk},
                       {"hidden", o.hidden},
                       {"dtype", o.dtype},     {"out_dtype", "bf16"}, {"iters", o.iters},
                       {"warmup", o.warmup},   {"seed", o.seed},  {"copy_bytes", "the op's own"},
                       {"ranks_per_node", o.ranks_per_node}, {"mode", o.mode}};
  if (!o.json_path.empty()) write_json(o.json_path, config, rows, {{"copy_gbps", copy_json}});
  if (!o.csv_path.empty()) write_csv(o.csv_path, rows);
  if (!o.plot_path.empty()) {
    // One panel per token count: pmoe's two ops and round trip against the two baselines over
    // the rank counts (log scale: dense padded is orders of magnitude slower).
    json drawn = json::array();
    for (const auto& r : rows)
      for (const char* op : {"dispatch", "combine", "dispatch_combine", "alltoallv", "dense_padded",
                             "nccl_alltoallv"})
        if (r["op"] == op && !r["mean_us"].is_null()) drawn.push_back(r);
    PlotSpec spec;
    spec.x = "ranks";
    spec.x_label = "ranks";
    spec.y = "mean_us";
    spec.y_label = "mean time per call (µs, slowest rank)";
    spec.series = "op";
    spec.panel = "tokens";
    spec.panel_label = "tokens per rank:";
    spec.title = detail::cat("all-to-all, ", o.experts, " experts, top-", o.topk, ", hidden ",
                             o.hidden, ", ", o.dtype, " (", runtime, ")");
    spec.log_y = true;
    plot_sweep(o.plot_path, drawn, spec);
  }
}

}  // namespace

}  // namespace all_to_all_bench

void add_all_to_all_command(CLI::App& app) {
  auto o = std::make_shared<all_to_all_bench::Options>();
  CLI::App* cmd = app.add_subcommand(
      "all-to-all",
      "dispatch/combine latency against all-to-all baselines (the table of pplx-kernels' README)");
  cmd->add_option("--ranks", o->ranks, "rank counts, comma-separated (threads; under mpirun the "
                                       "MPI processes)")
      ->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "tokens per rank, comma-separated")->capture_default_str();
  cmd->add_option("--experts", o->experts, "number of experts")->capture_default_str();
  cmd->add_option("--topk", o->topk, "experts per token")->capture_default_str();
  cmd->add_option("--hidden", o->hidden, "hidden dimension")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "dispatch payload: bf16 or f8e4m3 (128-element scales)")
      ->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed iterations")->capture_default_str();
  cmd->add_option("--ranks-per-node", o->ranks_per_node,
                  "split the ranks into nodes of this many (0: one node); off-node peers are "
                  "reached through the remote path only (--device cuda)")
      ->capture_default_str();
  cmd->add_option("--mode", o->mode,
                  "how tokens cross nodes: direct (a transfer per token and rank) or hierarchical "
                  "(per token and node, forwarded there by load/store; --device cuda, and "
                  "--ranks-per-node)")
      ->check(CLI::IsMember({"direct", "hierarchical"}))
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed warm-up iterations")->capture_default_str();
  cmd->add_option("--seed", o->seed, "routing and data seed")->capture_default_str();
  cmd->add_flag("!--no-staged", o->staged, "skip the rows with the caller's own buffers");
  cmd->add_flag("--rank-mask", o->rank_mask,
                "also time the op made maskable (AllToAllConfig::rank_mask, nobody masked), in "
                "turns with the plain one: rows dispatch_rank_mask and combine_rank_mask (CPU)");
  cmd->add_option("--on-peer-loss", o->on_peer_loss,
                  "mask: also time the op made with AllToAllConfig::on_peer_loss = mask (nobody "
                  "lost), in turns with the plain one: rows dispatch_peer_loss_mask and "
                  "combine_peer_loss_mask (CPU)")
      ->check(CLI::IsMember({"fail", "mask"}))
      ->capture_default_str();
  cmd->add_flag("--in-place,!--no-in-place", o->in_place,
                "--device cuda: run dispatch/combine on the op's in-place buffers "
                "(AllToAll::input_buffer(), expert_output_buffer()), as an MoE layer does "
                "(default); --no-in-place: on the caller's own device buffers")
      ->capture_default_str();
  cmd->add_option("--gpu", o->gpu,
                  "--device cuda on the emulated device: print the kernel model's µs for these "
                  "GPUs (comma-separated: h100-sxm, h200) beside the counts of each kernel and op "
                  "(tools/pmoe-bench/kernel_model.hpp); PMOE_EMU_SMS=132 gives the emulated "
                  "device the grid of an H100/H200");
  cmd->add_option("--device", o->device,
                  "cpu, or cuda: threads sharing GPU 0 (under mpirun: one process per GPU of "
                  "the node), timed with CUDA events; roofline: every rank copying into the next "
                  "rank's memory (peer copy across GPUs, local D2D on one GPU); on the emulated "
                  "device where no GPU is visible: checked, times not GPU speed, no roofline")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "write the results as JSON to this file");
  cmd->add_option("--csv", o->csv_path, "write the rows as CSV to this file");
  cmd->add_option("--plot", o->plot_path, "draw time over ranks per op to this PNG");
  cmd->callback([o, cmd] {
    o->ranks_given = cmd->get_option("--ranks")->count() > 0;
    all_to_all_bench::run(*o);
  });
}

}  // namespace pmoe::bench
