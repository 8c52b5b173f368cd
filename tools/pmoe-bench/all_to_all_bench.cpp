// `pmoe-bench all-to-all`: the dispatch/combine table of pplx-kernels' README, for pmoe, with
// its baselines and a roofline. For each rank count and tokens per rank, every path is first
// checked against the plain reference (a wrong result exits non-zero), then timed by the
// DESIGN.md protocol.
//
// The roofline is the memory-copy bandwidth measured in the same run: the ops' own timing loop
// (dispatch, then combine) with each op replaced by a memcpy of as many bytes as it must move
// (half read, half written, in the communicator's symmetric memory as the ops' rows are), all
// ranks at once, 20 iterations;
// copy_gbps = (bytes read + bytes written) / median time, per rank, for each op its own, and for
// the round trips and the baselines the two copies' sum. So a copy meets the cache as its op
// does: each evicts the other's data, as dispatch and combine do. pmoe's rows take the median
// of kRooflineRounds such measurements made in turns with their timed iterations. Sized to the
// op, in the op's loop, because this VM's copy rate falls from about 90 to 15 GB/s a rank as the
// copy outgrows the last-level cache (32 MiB shared here): a fixed 16 MiB copy sat on that edge
// and swung between 17 and 50 GB/s from run to run, and a copy of the op's bytes repeated on its
// own stays in the cache, which the ops' data does not
// (bench/results/2026-11-26_cpu-2core_all_to_all_mpi_op_roofline.md). An op's GB/s
// counts the bytes it must read and write, per rank (averaged over ranks):
//   dispatch: (tokens arriving + rows landed in expert_x) x (payload + scale bytes): every token
//             that crosses to the rank read once, every (token, local expert) row written once;
//   combine:  (rows summed) x (expert_y row bytes) read + (tokens) x (y row bytes) written;
//   round trips (pmoe dispatch+combine and the baselines): the sum of the two.
// copy_fraction = GB/s / copy_gbps: 1.0 would be an op as fast as memcpy of what it must move.
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
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <vector>

#include "all_to_all_baselines.hpp"
#include "all_to_all_bytes.hpp"
#include "all_to_all_cuda.hpp"
#include "bench_common.hpp"
#include "core/device_runtime.hpp"
#include "kernel_model.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/error.hpp"
#include "pmoe/diagnostics/kernel_counts.hpp"
#include "reference/all_to_all_reference.hpp"
#include "report.hpp"
#include "subcommands.hpp"

namespace pmoe::bench {
namespace {

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

constexpr int kRooflineRounds = 5;  // roofline measurements interleaved with pmoe's iterations
constexpr int kRooflineIters = 20;

AllToAllConfig config_for(const Options& o, int tokens) {
  AllToAllConfig c;
  c.max_num_tokens = tokens;
  c.num_experts = o.experts;
  c.experts_per_token = o.topk;
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

// Throws on every rank if any rank's check failed, naming the first failing rank's finding.
void agree_on_check(Communicator& comm, const std::string& what, const std::string& error) {
  char mine[256] = {};
  std::strncpy(mine, error.c_str(), sizeof mine - 1);
  const auto all = comm.all_gather(std::as_bytes(std::span(mine)));
  for (int r = 0; r < comm.size(); ++r) {
    const char* theirs = reinterpret_cast<const char*>(all.data()) + size_t(r) * sizeof mine;
    PMOE_CHECK(theirs[0] == '\0', "check failed: ", what, " on rank ", r, ": ", theirs);
  }
}

std::vector<double> sum_of(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

// The roofline of the dispatch-then-combine loop, per rank, every rank copying at once: each op
// replaced by a memcpy of half its bytes (read + written = its bytes). Its buffers are made once
// (collective) and measured in every round.
class CopyLoop {
 public:
  struct Rates {
    double dispatch, combine, round_trip;  // GB/s
  };

  CopyLoop(Communicator& comm, double dispatch_bytes, double combine_bytes)
      : comm_(comm), dispatch_(comm, dispatch_bytes), combine_(comm, combine_bytes) {}

  Rates measure() {
    const auto t = time_steps(comm_, 2, kRooflineIters,
                              {[&] { dispatch_.run(); }, [&] { combine_.run(); }});
    auto gbps = [](size_t half, double us) { return 2.0 * double(half) / (us * 1e3); };
    return {gbps(dispatch_.half, summarize(t[0]).median),
            gbps(combine_.half, summarize(t[1]).median),
            gbps(dispatch_.half + combine_.half, summarize(sum_of(t[0], t[1])).median)};
  }

 private:
  // In the communicator's symmetric memory, where the ops' rows lie: POSIX shared memory on
  // 4 KiB pages for MPI ranks (private buffers, which may get huge pages, copied at 16-19 or
  // 29-32 GB/s a rank from run to run here).
  struct Copy {
    std::unique_ptr<SymmetricMemory> memory;
    size_t half;
    Copy(Communicator& comm, double op_bytes)
        : half(size_t(std::max<int64_t>(int64_t(op_bytes / 2), 4096))) {
      memory = comm.alloc_symmetric(2 * half, 1);
      std::memset(memory->local(), 1, 2 * half);
    }
    void run() { std::memcpy(memory->local() + half, memory->local(), half); }
  };
  Communicator& comm_;
  Copy dispatch_, combine_;
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

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

detail::TrafficMode traffic_mode(const std::string& mode) {
  return mode == "hierarchical" ? detail::TrafficMode::hierarchical : detail::TrafficMode::direct;
}

// Per rank and link: the network as measured by the remote path (remote_traffic() around one
// call), and count_traffic's counts of every link for the same routing. matches: the measured
// network equals the count.
// The emulated device's counts of one call of an op on every rank (include/pmoe/diagnostics/kernel_counts.hpp),
// printed since the emulated device cannot time anything, with the bytes the op moved (read +
// written, every rank's kernels) beside the minimum it must move (`min_bytes`, every rank's), and,
// where --gpu names one, the kernel model's µs for that GPU (kernel_model.hpp). Kept in the JSON
// rows. The budgets the counts are held to are docs/gpu-all-to-all.md's.
// "a,b" -> {"a", "b"}; "" -> {}.
std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> names;
  for (size_t at = 0; at < list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) names.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return names;
}

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

void run_config(Communicator& comm, Context& ctx) {
  const Options& o = ctx.o;
  const AllToAllConfig cfg = config_for(o, ctx.tokens);
  const int W = comm.size(), rank = comm.rank();
  const int E_local = cfg.num_experts / W, H = cfg.hidden_dim, S = cfg.scales_per_token();
  const int64_t capacity = int64_t(W) * cfg.max_num_tokens;
  const bool f8 = cfg.in_dtype == DType::f8e4m3;
  const std::string where = detail::cat("ranks=", W, " tokens=", ctx.tokens);

  std::vector<reference::AllToAllInputs> all;
  for (int r = 0; r < W; ++r)
    all.push_back(reference::make_inputs(cfg, r, ctx.tokens, o.seed, reference::Routing::random));
  const auto& in = all[size_t(rank)];

  double dispatch_bytes = 0, combine_bytes = 0;
  {
    AllToAll a2a(comm, cfg);
    Buffer counts(DType::i32, {E_local});
    Buffer expert_x(cfg.in_dtype, {E_local, capacity, H});
    Buffer expert_x_scale = f8 ? Buffer(DType::f32, {E_local, capacity, S}) : Buffer();
    const Tensor expert_x_scale_arg = f8 ? expert_x_scale.tensor() : Tensor();
    const Tensor expert_y = a2a.expert_output_buffer();
    Buffer y(cfg.out_dtype, {ctx.tokens, H});
    // pmoe as it is meant to be used: tokens in the op's input buffer, expert outputs in its
    // expert output buffer, read in place by the peers on this node.
    const Tensor x(a2a.input_buffer().data(), cfg.in_dtype, {ctx.tokens, H});
    std::memcpy(x.data(), in.x.data<void>(), in.x.nbytes());
    Tensor x_scale;
    if (f8) {
      x_scale = Tensor(a2a.input_scale_buffer().data(), DType::f32, {ctx.tokens, S});
      std::memcpy(x_scale.data(), in.x_scale.data<void>(), in.x_scale.nbytes());
    }
    auto dispatch = [&](Phase p) {
      a2a.dispatch(x, x_scale, in.indices, counts, expert_x, expert_x_scale_arg, p);
    };
    auto combine = [&](Phase p) { a2a.combine(expert_y, in.indices, in.weights, y, p); };

    // --rank-mask or --on-peer-loss mask: a twin op made maskable (nobody masked, nobody lost),
    // on its own buffers, timed in turns with this one, so that what the mask costs when nobody
    // dies is a ratio of one run.
    AllToAllConfig mask_cfg = cfg;
    mask_cfg.rank_mask = o.rank_mask;
    if (o.on_peer_loss == "mask") mask_cfg.on_peer_loss = OnPeerLoss::mask;
    const std::string twin = o.rank_mask ? "rank_mask" : "peer_loss_mask";
    std::optional<AllToAll> maskable;
    Tensor mask_x, mask_expert_y;
    if (mask_cfg.maskable()) {
      PMOE_CHECK(!f8 && o.device == "cpu", "--rank-mask and --on-peer-loss mask: bf16 on the "
                 "CPU only");
      PMOE_CHECK(!(o.rank_mask && o.on_peer_loss == "mask"), "give --rank-mask or "
                 "--on-peer-loss mask, not both");
      maskable.emplace(comm, mask_cfg);
      mask_x = Tensor(maskable->input_buffer().data(), cfg.in_dtype, {ctx.tokens, H});
      std::memcpy(mask_x.data(), in.x.data<void>(), in.x.nbytes());
      mask_expert_y = maskable->expert_output_buffer();
    }
    auto dispatch_masked = [&] {
      maskable->dispatch(mask_x, Tensor(), in.indices, counts, expert_x, Tensor());
    };
    auto combine_masked = [&] { maskable->combine(mask_expert_y, in.indices, in.weights, y); };

    std::memset(expert_x.data<void>(), 0xA5, expert_x.nbytes());
    if (f8) std::memset(expert_x_scale.data<void>(), 0xA5, expert_x_scale.nbytes());
    dispatch(Phase::both);
    std::string error = reference::compare_dispatch(
        cfg, W, reference::reference_dispatch(cfg, W, rank, all), counts, expert_x,
        expert_x_scale_arg, 0xA5);
    reference::run_fake_experts(cfg, W, rank, counts, expert_x, expert_x_scale_arg, expert_y);
    combine(Phase::both);
    if (error.empty())
      error = reference::compare_bytes("y", y, reference::reference_combine(cfg, in, DType::bf16));
    agree_on_check(comm, "pmoe AllToAll, " + where, error);
    if (maskable) {
      std::memset(expert_x.data<void>(), 0xA5, expert_x.nbytes());
      dispatch_masked();
      error = reference::compare_dispatch(cfg, W, reference::reference_dispatch(cfg, W, rank, all),
                                          counts, expert_x, Tensor(), 0xA5);
      reference::run_fake_experts(cfg, W, rank, counts, expert_x, Tensor(), mask_expert_y);
      combine_masked();
      if (error.empty())
        error =
            reference::compare_bytes("y", y, reference::reference_combine(cfg, in, DType::bf16));
      agree_on_check(comm, "pmoe AllToAll with " + twin + ", " + where, error);
    }

    const AllToAllBytes bytes = required_bytes(comm, cfg, all, counts);
    dispatch_bytes = bytes.dispatch;
    combine_bytes = bytes.combine;

    // The rooflines in turns with the timed iterations, so that a drift of the machine moves both.
    std::vector<std::vector<double>> both(4);  // dispatch, combine; the maskable op's
    std::vector<double> copy_dispatch, copy_combine, copy_round_trip;
    const int per_round = (o.iters + kRooflineRounds - 1) / kRooflineRounds;
    CopyLoop copy_loop(comm, dispatch_bytes, combine_bytes);
    for (int round = 0, left = o.iters; left > 0; ++round, left -= per_round) {
      const CopyLoop::Rates copy = copy_loop.measure();
      copy_dispatch.push_back(copy.dispatch);
      copy_combine.push_back(copy.combine);
      copy_round_trip.push_back(copy.round_trip);
      std::vector<std::function<void()>> steps = {[&] { dispatch(Phase::both); },
                                                  [&] { combine(Phase::both); }};
      if (maskable) {
        steps.push_back(dispatch_masked);
        steps.push_back(combine_masked);
      }
      const auto t = time_steps(comm, round == 0 ? o.warmup : 1, std::min(per_round, left),
                                steps);
      for (size_t step = 0; step < t.size(); ++step)
        both[step].insert(both[step].end(), t[step].begin(), t[step].end());
    }
    ctx.copy_gbps = median_of(copy_round_trip);  // the round trips' and the baselines'

    const auto halves = time_steps(
        comm, o.warmup, o.iters,
        {[&] { dispatch(Phase::send); }, [&] { dispatch(Phase::recv); },
         [&] { combine(Phase::send); }, [&] { combine(Phase::recv); }});
    const size_t ws = a2a.workspace_bytes();
    ctx.add("dispatch", both[0], dispatch_bytes, ws, median_of(copy_dispatch));
    ctx.add("combine", both[1], combine_bytes, ws, median_of(copy_combine));
    ctx.add("dispatch_combine", sum_of(both[0], both[1]), dispatch_bytes + combine_bytes, ws);
    if (maskable) {
      const size_t mask_ws = maskable->workspace_bytes();
      ctx.add("dispatch_" + twin, both[2], dispatch_bytes, mask_ws, median_of(copy_dispatch));
      ctx.add("combine_" + twin, both[3], combine_bytes, mask_ws, median_of(copy_combine));
    }
    ctx.add("dispatch_send", halves[0], 0, ws);
    ctx.add("dispatch_recv", halves[1], 0, ws);
    ctx.add("combine_send", halves[2], 0, ws);
    ctx.add("combine_recv", halves[3], 0, ws);

    if (o.staged) {
      // The same op with the caller's own buffers: every token and expert row is staged once.
      Buffer own_expert_y(DType::bf16, {E_local, capacity, H});
      std::memcpy(own_expert_y.data<void>(), expert_y.data(), own_expert_y.nbytes());
      const auto staged = time_steps(
          comm, o.warmup, o.iters,
          {[&] { a2a.dispatch(in.x, in.x_scale_or_empty(), in.indices, counts, expert_x,
                              expert_x_scale_arg); },
           [&] { a2a.combine(own_expert_y, in.indices, in.weights, y); }});
      error = reference::compare_bytes("y", y, reference::reference_combine(cfg, in, DType::bf16));
      agree_on_check(comm, "pmoe AllToAll with caller buffers, " + where, error);
      ctx.add("dispatch_staged", staged[0], dispatch_bytes, ws, median_of(copy_dispatch));
      ctx.add("combine_staged", staged[1], combine_bytes, ws, median_of(copy_combine));
    }
  }

  // The baselines, one at a time so that their buffers never coexist.
  const std::pair<const char*, decltype(&make_alltoallv_path)> baselines[] = {
      {"alltoallv", &make_alltoallv_path}, {"dense_padded", &make_dense_padded_path}};
  for (const auto& [name, make] : baselines) {
    auto path = make(comm, cfg, in);
    path->dispatch();
    path->run_experts();
    path->combine();
    agree_on_check(comm, std::string(name) + ", " + where, path->check(all));
    const auto t = time_steps(comm, o.warmup, o.iters,
                              {[&] { path->dispatch(); }, [&] { path->combine(); }});
    ctx.add(name, sum_of(t[0], t[1]), dispatch_bytes + combine_bytes, 0);
  }
}

std::string cell(const json& row) {
  if (row["mean_us"].is_null()) return "not run";
  return format("%.1f", row["mean_us"].get<double>()) + " ± " +
         format("%.1f", row["std_us"].get<double>());
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

void add_all_to_all_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
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
    run(*o);
  });
}

}  // namespace pmoe::bench
