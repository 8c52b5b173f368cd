// `pmoe-bench all-to-all` on the CPU backend: one configuration (rank count, tokens per rank)
// checked and timed, pmoe's AllToAll and its baselines, with the memory-copy roofline measured in
// the same loop (all_to_all_bench.cpp: the command and what its GB/s count).
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
// (bench/results/2026-11-26_cpu-2core_all_to_all_mpi_op_roofline.md).
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "all_to_all_baselines.hpp"
#include "all_to_all_bench.hpp"
#include "all_to_all_bytes.hpp"
#include "bench_common.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/error.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::bench::all_to_all_bench {
namespace {

constexpr int kRooflineRounds = 5;  // roofline measurements interleaved with pmoe's iterations
constexpr int kRooflineIters = 20;

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

}  // namespace

void run_config(Communicator& comm, Context& ctx) {
  const Options& o = ctx.o;
  const AllToAllConfig cfg = config_for(o, ctx.tokens);
  const int W = comm.size(), rank = comm.rank();
  const int E_local = cfg.num_experts / W, H = cfg.hidden_dim, S = cfg.scales_per_token();
  const int64_t capacity = int64_t(W) * cfg.max_tokens;
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

}  // namespace pmoe::bench::all_to_all_bench
