// `pmoe-bench ag-gemm M N K` and `pmoe-bench gemm-rs M N K`: comm/GEMM overlap against the
// serial baseline, the table of Flux's profiling harness (test_ag_kernel.py, test_gemm_rs.py).
//
// Each iteration times, each after a barrier and as the slowest rank's time:
//   serial comm    run_serial(communicate): the all-gather (or reduce-scatter) alone
//   serial gemm    run_serial(gemm): one GEMM over all rows
//   serial total   run_serial(): the two back to back
//   overlapped     run(): piece by piece, the next piece moving while this one is multiplied
//   gemm-only      run_gemm_only(): run()'s GEMMs with no communication
// and reports, from the medians: exposed comm = overlapped - gemm-only; speedup = serial total /
// overlapped; comm hidden = 1 - exposed / serial comm; and overlapped / max(comm, gemm), the
// figure the overlap target is stated in (1 would be perfect overlap).
//
// Before timing, run() and run_serial() are checked against the reference at sampled elements
// of every rank's C (the first and last row or column of every piece, plus random ones); run()
// is checked again after timing. A failed check exits non-zero.
//
// --device cuda: the ops on the CUDA backend, the thread ranks sharing GPU 0 (under mpirun, one
// process per rank on the node's GPUs), A, B and C in device memory, each step timed with events
// on the rank's stream (run() forks its copy stream from it and joins it back). On the emulated
// device (no GPU visible) the same checks run and the times are labelled emulation.

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "bench_common.hpp"
#include "core/device_runtime.hpp"
#include "cpu/gemm.hpp"
#include "overlap/plan.hpp"
#include "pmoe/error.hpp"
#include "pmoe/overlap.hpp"
#include "pmoe/stream.hpp"
#include "reference/overlap_reference.hpp"
#include "reference/workload.hpp"
#include "report.hpp"
#include "subcommands.hpp"

namespace pmoe::bench {
namespace {

struct Options {
  bool gather = true;  // ag-gemm, else gemm-rs
  int64_t m = 1024, n = 4096, k = 4096;
  std::string dtype = "bf16";
  int iters = 20;
  int warmup = 3;
  int chunks = 0;
  std::string order = "all-pairs";
  int ranks = 2;
  int blas_threads = 0;  // 0: automatic, see blas_threads_for()
  int64_t min_overlap_bytes = OverlapConfig{}.min_overlap_bytes;
  uint64_t seed = 1;
  std::string device = "cpu";  // or "cuda"
  std::string copy = "engine";  // --device cuda: copy engines, or "kernel" (PMOE_OVERLAP_COPY)
  std::string json_path, csv_path, plot_path;
  bool ranks_given = false;  // --ranks on the command line (under mpirun it must match)
};

struct Outcome {
  std::vector<Stats> steps;  // in the order of kStepNames
  size_t workspace_bytes = 0;
  bool overlaps = false;
  int64_t checked_elements = 0;
};

constexpr const char* kStepNames[] = {"serial comm", "serial gemm", "serial total", "overlapped",
                                      "gemm-only"};
constexpr const char* kStepKeys[] = {"serial_comm", "serial_gemm", "serial_total", "overlapped",
                                     "gemm_only"};

// BLAS threads per rank: with at least two cores per rank, one core is left to the rank's
// communication thread; otherwise one thread (ranks x BLAS threads never exceeds the cores).
int blas_threads_for(int ranks) {
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const int per_rank = std::max(1, cores / std::max(1, ranks));
  return per_rank >= 2 ? per_rank - 1 : 1;
}

OverlapConfig config_of(const Options& o) {
  OverlapConfig c;
  c.m = o.m;
  c.n = o.n;
  c.k = o.k;
  c.dtype = parse_dtype(o.dtype);
  c.chunks = o.chunks;
  c.order = parse_order(o.order.c_str());
  c.min_overlap_bytes = o.min_overlap_bytes;
  return c;
}

// Elements of this rank's C to check: the first and last row (AllGatherGemm) or column
// (GemmReduceScatter) of every piece, plus 4 random rows and 2 random columns, and the first and
// last of the other dimension.
void sample(const Options& o, const OverlapConfig& c, int W, int rank, std::vector<int64_t>& rows,
            std::vector<int64_t>& cols) {
  const int P = c.chunks_for(W) / W;
  const int64_t c_rows = o.gather ? c.m : c.m / W, c_cols = o.gather ? c.n / W : c.n;
  rows = {0, c_rows - 1};
  cols = {0, c_cols - 1};
  for (int b = 0; b < (o.gather ? W : 1); ++b)
    for (int p = 0; p < P; ++p) {
      const detail::EvenSplit split{o.gather ? c.m / W : c.n, P};
      const int64_t first = (o.gather ? b * (c.m / W) : 0) + split.begin(p);
      auto& boundaries = o.gather ? rows : cols;
      boundaries.push_back(first);
      boundaries.push_back(first + split.size(p) - 1);
    }
  for (uint64_t i = 0; i < 4; ++i)
    rows.push_back(int64_t(reference::hash64(o.seed, 17, uint64_t(rank), i) % uint64_t(c_rows)));
  for (uint64_t i = 0; i < 2; ++i)
    cols.push_back(int64_t(reference::hash64(o.seed, 18, uint64_t(rank), i) % uint64_t(c_cols)));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::sort(cols.begin(), cols.end());
  cols.erase(std::unique(cols.begin(), cols.end()), cols.end());
}

// Throws pmoe::Error on every rank if `error` is non-empty on any rank.
void agree(Communicator& comm, const std::string& error, const char* what) {
  const char failed = error.empty() ? 0 : 1;
  const auto votes = comm.all_gather(std::as_bytes(std::span(&failed, 1)));
  for (int r = 0; r < comm.size(); ++r)
    PMOE_CHECK(votes[size_t(r)] == std::byte{0}, "check failed (", what, ")",
               r == comm.rank() ? ": " + error : " on rank " + std::to_string(r));
}

// Each step timed with events on the rank's stream, a barrier (after the stream drained)
// before each; a step's time in an iteration is the slowest rank's. Microseconds.
std::vector<std::vector<double>> time_on_stream(Communicator& comm, int warmup, int iters,
                                                const std::vector<std::function<void()>>& steps) {
  const detail::DeviceRuntime& runtime = detail::device_runtime();
  const Stream stream = comm.stream();
  void* start = runtime.create_event();
  void* stop = runtime.create_event();
  std::vector<double> mine(steps.size() * size_t(iters));  // [step][iteration]
  for (int i = -warmup; i < iters; ++i)
    for (size_t s = 0; s < steps.size(); ++s) {
      synchronize(stream);
      comm.barrier();
      runtime.record_event(start, stream);
      steps[s]();
      runtime.record_event(stop, stream);
      const double ms = runtime.elapsed_ms(start, stop);
      if (i >= 0) mine[s * size_t(iters) + size_t(i)] = 1e3 * ms;
    }
  runtime.destroy_event(start);
  runtime.destroy_event(stop);
  const auto all = comm.all_gather(std::as_bytes(std::span(mine)));
  const auto* t = reinterpret_cast<const double*>(all.data());
  std::vector<std::vector<double>> slowest(steps.size(), std::vector<double>(size_t(iters), 0.0));
  for (int r = 0; r < comm.size(); ++r)
    for (size_t s = 0; s < steps.size(); ++s)
      for (size_t i = 0; i < size_t(iters); ++i)
        slowest[s][i] = std::max(slowest[s][i], t[size_t(r) * mine.size() + s * size_t(iters) + i]);
  return slowest;
}

template <typename Op>
Outcome run_on(Communicator& comm, const Options& o) {
  const OverlapConfig cfg = config_of(o);
  const int W = comm.size(), rank = comm.rank();
  const Device device = comm.device();
  const bool on_device = device.kind != Device::Kind::cpu;
  Op op(comm, cfg, device);
  const auto host_in = o.gather ? reference::make_all_gather_gemm_inputs(cfg, W, rank, o.seed)
                                : reference::make_gemm_reduce_scatter_inputs(cfg, W, rank, o.seed);
  Buffer host_C =
      o.gather ? Buffer(cfg.dtype, {cfg.m, cfg.n / W}) : Buffer(cfg.dtype, {cfg.m / W, cfg.n});
  // On a device: A, B and C in its memory, C read back (after the stream ran) to be checked.
  struct {
    Buffer A, B;
  } in;
  Buffer C;
  if (on_device) {
    in.A = Buffer::like(host_in.A, device);
    in.B = Buffer::like(host_in.B, device);
    copy(in.A, host_in.A);
    copy(in.B, host_in.B);
    C = Buffer::like(host_C, device);
  }
  const Tensor A = on_device ? Tensor(in.A) : Tensor(host_in.A);
  const Tensor B = on_device ? Tensor(in.B) : Tensor(host_in.B);
  const Tensor C_arg = on_device ? Tensor(C) : Tensor(host_C);

  std::vector<int64_t> rows, cols;
  sample(o, cfg, W, rank, rows, cols);
  const reference::Expected want =
      reference::sampled_reference(o.gather, cfg, W, rank, o.seed, rows, cols);
  auto check = [&](const char* what, const std::function<void()>& call) {
    std::memset(host_C.data<void>(), 0xFF, host_C.nbytes());  // NaN: an unwritten element fails
    if (on_device) copy(C, host_C);
    call();
    if (on_device) {
      synchronize(comm.stream());
      copy(host_C, C);
    }
    agree(comm, reference::compare_close(what, host_C, want), what);
  };
  check("run()", [&] { op.run(A, B, C_arg); });
  check("run_serial()", [&] { op.run_serial(A, B, C_arg); });

  const auto communicate = [&] { op.run_serial(A, B, C_arg, SerialStep::communicate); };
  const auto gemm = [&] { op.run_serial(A, B, C_arg, SerialStep::gemm); };
  // The collective and the GEMM in the op's order, each step timed on its own.
  std::vector<std::function<void()>> steps;
  if (o.gather)
    steps = {communicate, gemm};
  else
    steps = {gemm, communicate};
  steps.push_back([&] { op.run_serial(A, B, C_arg); });
  steps.push_back([&] { op.run(A, B, C_arg); });
  steps.push_back([&] { op.run_gemm_only(A, B, C_arg); });
  const auto times = on_device ? time_on_stream(comm, o.warmup, o.iters, steps)
                               : time_steps(comm, o.warmup, o.iters, steps);
  check("run() after timing", [&] { op.run(A, B, C_arg); });

  Outcome out;
  const int comm_index = o.gather ? 0 : 1, gemm_index = o.gather ? 1 : 0;
  out.steps = {summarize(times[size_t(comm_index)]), summarize(times[size_t(gemm_index)]),
               summarize(times[2]), summarize(times[3]), summarize(times[4])};
  out.workspace_bytes = op.workspace_bytes();
  out.overlaps = op.overlaps();
  out.checked_elements = int64_t(rows.size() * cols.size());
  return out;
}

// What ran the op, for the header and the JSON: the CPU, a GPU, or the emulated device.
std::string runtime_of(const Options& o) {
  if (o.device == "cpu") return "cpu";
  return cuda_emulated() ? "emulated CUDA (times: emulation, not GPU speed)" : "CUDA GPU";
}

void report(const Options& o, const OverlapConfig& cfg, int W, int blas, const Outcome& out) {
  const char* name = o.gather ? "AllGatherGemm" : "GemmReduceScatter";
  const double ms = 1e-3;
  const bool cuda = o.device == "cuda";
  const std::string how =
      cuda ? detail::cat("device ", runtime_of(o),
                         ", GEMMs through cuBLAS on the rank's stream, transfers on its copy "
                         "stream as ",
                         o.copy == "kernel" ? "a copy kernel on 8 blocks" : "copy-engine copies",
                         ", timed with events")
           : detail::cat("BLAS threads ", blas, " per rank, ",
                         out.overlaps ? "transfers on a communication thread"
                                      : "transfers on the rank's own thread (off-node peers)");
  std::printf(
      "\n%s M=%ld N=%ld K=%ld %s, %d ranks (%s), chunks %d, %s order, %s; %d iterations after %d "
      "warm-ups; time = slowest rank per iteration; workspace %.1f MiB per rank\n\n",
      name, long(cfg.m), long(cfg.n), long(cfg.k), o.dtype.c_str(), W,
      launched_by_mpi() ? "MPI processes" : cuda ? "threads sharing GPU 0" : "threads",
      cfg.chunks_for(W), order_name(cfg.order), how.c_str(), o.iters, o.warmup,
      double(out.workspace_bytes) / (1 << 20));
  if (cuda && cuda_emulated())
    std::printf("CUDA runtime: the emulated device (no GPU visible, or PMOE_CUDA_EMULATE=1): "
                "checked against the reference as on a GPU; the times are emulation times, not "
                "GPU speed.\n\n");

  nlohmann::json rows = nlohmann::json::array();
  for (size_t s = 0; s < out.steps.size(); ++s) {
    const Stats& st = out.steps[s];
    rows.push_back({{"step", kStepNames[s]},
                    {"min_ms", st.min * ms},
                    {"median_ms", st.median * ms},
                    {"max_ms", st.max * ms},
                    {"mean_ms", st.mean * ms},
                    {"std_ms", st.std * ms}});
  }
  print_markdown({column("step", "step"), column("min (ms)", "min_ms", "%.3f"),
                  column("median (ms)", "median_ms", "%.3f"), column("max (ms)", "max_ms", "%.3f"),
                  column("mean (ms)", "mean_ms", "%.3f"), column("std (ms)", "std_ms", "%.3f")},
                 rows);

  const double comm = out.steps[0].median * ms, gemm = out.steps[1].median * ms;
  const double serial = out.steps[2].median * ms, overlapped = out.steps[3].median * ms;
  const double gemm_only = out.steps[4].median * ms, exposed = overlapped - gemm_only;
  nlohmann::json summary = {{"serial_comm_ms", comm},
                            {"serial_gemm_ms", gemm},
                            {"serial_total_ms", serial},
                            {"overlapped_ms", overlapped},
                            {"gemm_only_ms", gemm_only},
                            {"exposed_comm_ms", exposed},
                            {"speedup", serial / overlapped},
                            {"comm_hidden", comm > 0 ? 1.0 - exposed / comm : 0.0},
                            {"overlapped_over_max", overlapped / std::max(comm, gemm)}};
  std::printf("\nMedians:\n\n");
  print_markdown(
      {column("serial comm (ms)", "serial_comm_ms", "%.3f"),
       column("serial gemm (ms)", "serial_gemm_ms", "%.3f"),
       column("serial total (ms)", "serial_total_ms", "%.3f"),
       column("overlapped (ms)", "overlapped_ms", "%.3f"),
       column("gemm-only (ms)", "gemm_only_ms", "%.3f"),
       column("exposed comm (ms)", "exposed_comm_ms", "%.3f"),
       column("speedup vs serial", "speedup", "%.3f"), column("comm hidden", "comm_hidden", "%.2f"),
       column("overlapped / max(comm, gemm)", "overlapped_over_max", "%.3f")},
      nlohmann::json::array({summary}));
  std::printf(
      "\ncheck passed: run() (before and after timing) and run_serial() match the "
      "reference at %ld sampled elements of C on every rank\n",
      long(out.checked_elements));

  const nlohmann::json config = {{"op", o.gather ? "ag-gemm" : "gemm-rs"},
                                 {"device", o.device},
                                 {"copy", o.device == "cuda" ? o.copy : "none"},
                                 {"runtime", runtime_of(o)},
                                 {"m", cfg.m},
                                 {"n", cfg.n},
                                 {"k", cfg.k},
                                 {"dtype", o.dtype},
                                 {"ranks", W},
                                 {"chunks", cfg.chunks_for(W)},
                                 {"order", order_name(cfg.order)},
                                 {"iters", o.iters},
                                 {"warmup", o.warmup},
                                 {"blas_threads", blas},
                                 {"communication_thread", out.overlaps},
                                 {"seed", o.seed},
                                 {"workspace_bytes", out.workspace_bytes}};
  if (!o.json_path.empty())
    write_json(o.json_path, config, rows, {{"summary", summary}, {"check", "passed"}});
  if (!o.csv_path.empty()) {
    nlohmann::json flat = rows;
    for (auto& row : flat)
      for (const auto& item : config.items()) row[item.key()] = item.value();
    write_csv(o.csv_path, flat);
  }
  if (!o.plot_path.empty()) {
    PlotSpec spec;
    spec.x = "step";
    spec.x_label = "what ran";
    spec.y = "median_ms";
    spec.y_label = "time per call (ms): median, min..max";
    spec.y_min = "min_ms";
    spec.y_max = "max_ms";
    spec.bars = true;
    spec.title = detail::cat(name, " M=", cfg.m, " N=", cfg.n, " K=", cfg.k, " ", o.dtype, ", ",
                             W, " ranks");
    plot_sweep(o.plot_path, rows, spec);
  }
}

void run(const Options& o) {
  PMOE_CHECK(o.iters >= 1 && o.warmup >= 0, "--iters must be >= 1 and --warmup >= 0");
  PMOE_CHECK(o.ranks >= 1, "--ranks must be >= 1, got ", o.ranks);
  PMOE_CHECK(o.blas_threads >= 0, "--blas-threads must be >= 0 (0: automatic), got ",
             o.blas_threads);
  PMOE_CHECK(o.device == "cpu" || o.device == "cuda", "--device must be cpu or cuda, got '",
             o.device, "'");
  PMOE_CHECK(o.copy == "engine" || o.copy == "kernel", "--copy must be engine or kernel, got '",
             o.copy, "'");
  PMOE_CHECK(o.copy == "engine" || o.device == "cuda", "--copy kernel needs --device cuda");
  if (o.device == "cuda") setenv("PMOE_OVERLAP_COPY", o.copy.c_str(), 1);  // read by the ops
  const OverlapConfig cfg = config_of(o);
  const int W = rank_counts_to_run(o.ranks_given, {o.ranks})[0];
  cfg.validate(o.gather ? "AllGatherGemm" : "GemmReduceScatter", W);  // before any rank runs
  const int blas = o.blas_threads > 0 ? o.blas_threads : blas_threads_for(W);
  cpu::set_blas_threads(blas);

  std::mutex mutex;
  Outcome outcome;
  auto body = [&](Communicator& comm) {
    const Outcome mine =
        o.gather ? run_on<AllGatherGemm>(comm, o) : run_on<GemmReduceScatter>(comm, o);
    if (comm.rank() != 0) return;
    std::lock_guard lock(mutex);
    outcome = mine;
  };
  run_on_ranks(launched_by_mpi() ? 0 : W, body,
               o.device == "cpu" ? Device::cpu() : Device::cuda(0));
  if (is_printing_rank()) report(o, cfg, W, blas, outcome);
}

void add_command(CLI::App& app, bool gather) {
  auto o = std::make_shared<Options>();
  o->gather = gather;
  CLI::App* cmd = app.add_subcommand(
      gather ? "ag-gemm" : "gemm-rs",
      gather ? "all-gather + GEMM: overlapped vs serial (the table of Flux's test_ag_kernel.py)"
             : "GEMM + reduce-scatter: overlapped vs serial (the table of Flux's test_gemm_rs.py)");
  cmd->add_option("M", o->m, "global rows of A and C")->capture_default_str();
  cmd->add_option("N", o->n, "global columns of B and C")->capture_default_str();
  cmd->add_option("K", o->k, "global contracted dimension")->capture_default_str();
  cmd->add_option("--dtype", o->dtype,
                  "f32, bf16 or f16 (or float32, bfloat16, float16); 16-bit types are multiplied "
                  "with f32 accumulation")
      ->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed iterations")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed warm-up iterations")->capture_default_str();
  cmd->add_option("--chunks", o->chunks,
                  "pieces of M in the pipeline, a multiple of the ranks "
                  "(0: one per rank)")
      ->capture_default_str();
  cmd->add_option("--order", o->order, "all-pairs (direct puts) or ring (relay to rank r-1)")
      ->capture_default_str();
  cmd->add_option("--ranks", o->ranks, "ranks as threads (under mpirun: the processes)")
      ->capture_default_str();
  cmd->add_option("--blas-threads", o->blas_threads,
                  "BLAS threads per rank (0: cores per rank - 1 when >= 2, else 1)")
      ->capture_default_str();
  cmd->add_option("--min-overlap-bytes", o->min_overlap_bytes,
                  "calls moving fewer bytes per rank keep their transfers on the calling thread")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "input seed")->capture_default_str();
  cmd->add_option("--device", o->device,
                  "cpu, or cuda: the CUDA backend, thread ranks sharing GPU 0 (under mpirun one "
                  "process per rank on the node's GPUs); on the emulated device where no GPU is "
                  "visible: checked, times labelled emulation")
      ->capture_default_str();
  cmd->add_option("--copy", o->copy,
                  "--device cuda: how pieces move, engine (cudaMemcpyAsync on the copy engines) "
                  "or kernel (a copy kernel on 8 blocks); sets PMOE_OVERLAP_COPY")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "write the results as JSON to this file");
  cmd->add_option("--csv", o->csv_path, "write the per-step rows as CSV to this file");
  cmd->add_option("--plot", o->plot_path,
                  "draw the median time of each step (serial, overlapped, GEMM only) to this PNG");
  cmd->callback([o, cmd] {
    o->ranks_given = cmd->get_option("--ranks")->count() > 0;
    run(*o);
  });
}

}  // namespace

void add_overlap_commands(CLI::App& app) {
  add_command(app, /*gather=*/true);
  add_command(app, /*gather=*/false);
}

}  // namespace pmoe::bench
