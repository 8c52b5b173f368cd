// `pmoe-bench all-to-all`: dispatch and combine latency per rank count and tokens per rank, the
// seed 002 table for pmoe. Each configuration is first checked against the plain reference.
//
// GB/s counts the rows each rank receives: dispatch delivers (rows landed in expert_x) x (payload
// + scales) bytes; combine delivers (rows returned to their source) x (expert_y row) bytes.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/error.hpp"
#include "reference/all_to_all_reference.hpp"
#include "subcommands.hpp"

namespace pmoe::bench {
namespace {

struct Options {
  std::string ranks = "2,4";
  std::string tokens = "1,128";
  int experts = 256;
  int topk = 8;
  int hidden = 7168;
  std::string dtype = "bf16";
  int iters = 20;
  int warmup = 3;
  uint64_t seed = 1;
  std::string json_path;
};

struct Row {
  std::string op;
  int ranks, tokens;
  Stats us;
  double gbps;
  size_t workspace_bytes;
};

AllToAllConfig config_for(const Options& o, int tokens) {
  AllToAllConfig c;
  c.max_num_tokens = tokens;
  c.num_experts = o.experts;
  c.experts_per_token = o.topk;
  c.hidden_dim = o.hidden;
  c.in_dtype = parse_dtype(o.dtype);
  c.scale_block = c.in_dtype == DType::f8e4m3 ? 128 : 0;
  c.out_dtype = DType::bf16;
  return c;
}

// Runs one (ranks, tokens) configuration: check, then time. Appends rows (on every rank).
void run_config(Communicator& comm, const Options& o, int tokens, std::vector<Row>& rows) {
  const AllToAllConfig cfg = config_for(o, tokens);
  const int W = comm.size(), rank = comm.rank();
  const int E_local = cfg.num_experts / W, H = cfg.hidden_dim, S = cfg.scales_per_token();
  const int64_t capacity = int64_t(W) * cfg.max_num_tokens;
  const bool f8 = cfg.in_dtype == DType::f8e4m3;
  const DType expert_y_dtype = DType::bf16;

  std::vector<reference::AllToAllInputs> all;
  for (int r = 0; r < W; ++r)
    all.push_back(reference::make_inputs(cfg, r, tokens, o.seed, reference::Routing::random));
  const auto& in = all[size_t(rank)];

  AllToAll a2a(comm, cfg);
  Buffer counts(DType::i32, {E_local});
  Buffer expert_x(cfg.in_dtype, {E_local, capacity, H});
  Buffer expert_x_scale = f8 ? Buffer(DType::f32, {E_local, capacity, S}) : Buffer();
  const Tensor expert_x_scale_arg = f8 ? expert_x_scale.tensor() : Tensor();
  Buffer expert_y(expert_y_dtype, {E_local, capacity, H});
  Buffer y(cfg.out_dtype, {tokens, H});

  auto dispatch = [&] {
    a2a.dispatch(in.x, in.x_scale_or_empty(), in.indices, counts, expert_x, expert_x_scale_arg);
  };
  auto combine = [&] { a2a.combine(expert_y, in.indices, in.weights, y); };

  // The check: the first call must match the reference exactly, on every rank.
  std::memset(expert_x.data<void>(), 0xA5, expert_x.nbytes());
  if (f8) std::memset(expert_x_scale.data<void>(), 0xA5, expert_x_scale.nbytes());
  dispatch();
  std::string error = reference::compare_dispatch(
      cfg, W, reference::reference_dispatch(cfg, W, rank, all), counts, expert_x,
      expert_x_scale_arg, 0xA5);
  reference::run_fake_experts(cfg, W, rank, counts, expert_x, expert_x_scale_arg, expert_y);
  combine();
  if (error.empty())
    error = reference::compare_bytes("combine y", y,
                                     reference::reference_combine(cfg, in, expert_y_dtype));
  char failed = error.empty() ? 0 : 1;
  const auto votes = comm.all_gather(std::as_bytes(std::span(&failed, 1)));
  for (int r = 0; r < W; ++r)
    PMOE_CHECK(votes[size_t(r)] == std::byte{0}, "check failed for ranks=", W, " tokens=", tokens,
               (r == rank ? ": " + error : " on rank " + std::to_string(r)));

  const auto times = time_steps(comm, o.warmup, o.iters, {dispatch, combine});

  // Bytes delivered, averaged over ranks.
  int64_t received = 0;
  for (int e = 0; e < E_local; ++e) received += counts.data<int32_t>()[e];
  const auto all_received = comm.all_gather(std::as_bytes(std::span(&received, 1)));
  double rows_per_rank = 0;
  for (int r = 0; r < W; ++r)
    rows_per_rank += double(reinterpret_cast<const int64_t*>(all_received.data())[r]) / W;
  const double dispatch_bytes =
      rows_per_rank * (double(H) * dtype_size(cfg.in_dtype) + sizeof(float) * S);
  const double combine_bytes = rows_per_rank * double(H) * dtype_size(expert_y_dtype);

  const Stats d = summarize(times[0]), c = summarize(times[1]);
  rows.push_back({"dispatch", W, tokens, d, dispatch_bytes / (d.mean * 1e3), a2a.workspace_bytes()});
  rows.push_back({"combine", W, tokens, c, combine_bytes / (c.mean * 1e3), a2a.workspace_bytes()});
}

void print_table(const Options& o, const std::vector<Row>& rows) {
  std::printf("\nAllToAll, E=%d top-k=%d H=%d %s, %d iterations after %d warm-ups; "
              "time = slowest rank per iteration\n\n",
              o.experts, o.topk, o.hidden, o.dtype.c_str(), o.iters, o.warmup);
  std::printf("| op | ranks | tokens/rank | mean ± std (µs) | min (µs) | median (µs) | GB/s | "
              "workspace/rank (MiB) |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows)
    std::printf("| %s | %d | %d | %.1f ± %.1f | %.1f | %.1f | %.2f | %.1f |\n", r.op.c_str(),
                r.ranks, r.tokens, r.us.mean, r.us.std, r.us.min, r.us.median, r.gbps,
                double(r.workspace_bytes) / (1 << 20));
}

void write_json(const Options& o, const std::vector<Row>& rows) {
  nlohmann::json out;
  out["machine"] = machine_info();
  out["commit"] = git_commit();
  out["config"] = {{"experts", o.experts}, {"topk", o.topk}, {"hidden", o.hidden},
                   {"dtype", o.dtype},     {"iters", o.iters}, {"warmup", o.warmup}};
  out["rows"] = nlohmann::json::array();
  for (const Row& r : rows)
    out["rows"].push_back({{"op", r.op}, {"ranks", r.ranks}, {"tokens", r.tokens},
                           {"mean_us", r.us.mean}, {"std_us", r.us.std}, {"min_us", r.us.min},
                           {"median_us", r.us.median}, {"max_us", r.us.max}, {"gbps", r.gbps},
                           {"workspace_bytes", r.workspace_bytes}});
  std::ofstream(o.json_path) << out.dump(2) << "\n";
}

void run(const Options& o) {
  PMOE_CHECK(o.iters >= 1 && o.warmup >= 0, "--iters must be >= 1 and --warmup >= 0");
  std::vector<int> rank_counts = parse_int_list(o.ranks, "--ranks");
  if (launched_by_mpi()) {
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    rank_counts = {world};
  }
  std::vector<Row> rows;
  for (int W : rank_counts) {
    for (int tokens : parse_int_list(o.tokens, "--tokens")) {
      std::mutex mutex;
      run_on_ranks(launched_by_mpi() ? 0 : W, [&](Communicator& comm) {
        std::vector<Row> mine;
        run_config(comm, o, tokens, mine);
        if (comm.rank() == 0) {
          std::lock_guard lock(mutex);
          rows.insert(rows.end(), mine.begin(), mine.end());
        }
      });
    }
  }
  if (!is_printing_rank()) return;
  print_table(o, rows);
  if (!o.json_path.empty()) write_json(o, rows);
}

}  // namespace

void add_all_to_all_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("all-to-all", "dispatch/combine latency (seed 002's table)");
  cmd->add_option("--ranks", o->ranks, "rank counts, comma-separated (threads)")
      ->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "tokens per rank, comma-separated")->capture_default_str();
  cmd->add_option("--experts", o->experts, "number of experts")->capture_default_str();
  cmd->add_option("--topk", o->topk, "experts per token")->capture_default_str();
  cmd->add_option("--hidden", o->hidden, "hidden dimension")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "dispatch payload: bf16, f16, f32 or f8e4m3")
      ->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed iterations")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed warm-up iterations")->capture_default_str();
  cmd->add_option("--seed", o->seed, "routing and data seed")->capture_default_str();
  cmd->add_option("--json", o->json_path, "write the results as JSON to this file");
  cmd->callback([o] { run(*o); });
}

}  // namespace pmoe::bench
