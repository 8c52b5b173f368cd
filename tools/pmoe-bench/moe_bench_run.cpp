// Measures one MoE layer variant at one setting: build it on its ranks, check one forward against
// the plain reference, time forwards with the protocol of bench_common (barrier before every
// iteration, the slowest rank's time), and collect every rank's memory, work and phase times.
//
// BLAS threads: Simple runs on one rank with every core's BLAS thread (the whole machine for the
// whole model); TP and EP ranks get cores / ranks threads each (at least 1), so the ranks never
// oversubscribe the machine by accident; with 4 thread ranks on 2 cores each rank has 1 thread
// and the OS shares the cores between them.
//
// On a CUDA device (--device cuda) the ranks are threads sharing GPU 0, each on its own stream;
// x and y are in device memory, a forward's time runs from its launch to the end of its stream
// (synchronize), and the phase times are the layer's own, from events around its phases
// (src/cuda/moe/phase_timer.hpp). Memory is the device's: the most device memory in use while
// the layers and their x and y existed, less what was in use before, shared out evenly over the
// ranks holding a layer (they hold the same buffers). The emulated device's allocator keeps that
// peak; on a GPU it is cudaMemGetInfo's use sampled after the layers are built and after the
// timed forwards (a forward allocates nothing), other processes on the GPU included.
//
// The GEMM rate (EP, --gemm-rate): after the layer is timed and freed, every rank times a dense
// GEMM pair over as many rows as its experts computed ([rows, H] x [H, g F], then [rows, F] x
// [F, O]: the same FLOPs, one expert's weight shapes), with all ranks running at once after a
// barrier, exactly as during EpMoe's expert stage. The rate of each is that rank's FLOPs over
// the median of its own times.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "core/device_runtime.hpp"
#include "cpu/gemm.hpp"
#include "moe_bench.hpp"
#include "pmoe/error.hpp"
#include "pmoe/memory.hpp"

namespace pmoe::bench {

const char* variant_key(MoeVariantKind v) {
  switch (v) {
    case MoeVariantKind::simple:
      return "simple";
    case MoeVariantKind::tp:
      return "tp";
    case MoeVariantKind::ep:
      return "ep";
  }
  return "?";
}

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median_of(std::vector<double> values) { return summarize(std::move(values)).median; }

// One of the three layers behind one interface.
struct Layer {
  std::unique_ptr<SimpleMoe> simple;
  std::unique_ptr<TpMoe> tp;
  std::unique_ptr<EpMoe> ep;

  void forward(const Tensor& x, const Tensor& y) {
    if (simple) simple->forward(x, y);
    if (tp) tp->forward(x, y);
    if (ep) ep->forward(x, y);
  }
  const MoeStats& stats() const {
    return simple ? simple->last_stats() : tp ? tp->last_stats() : ep->last_stats();
  }
  size_t weight_bytes() const {
    return simple ? simple->weight_bytes() : tp ? tp->weight_bytes() : ep->weight_bytes();
  }
  size_t workspace_bytes() const {
    return simple ? simple->workspace_bytes() : tp ? tp->workspace_bytes() : ep->workspace_bytes();
  }
  bool active() const { return simple || tp || ep; }
};

// What each rank reports; all doubles, so that all_gather moves it as bytes.
struct RankReport {
  double peak_bytes, weight_bytes, workspace_bytes, rss_bytes;
  double gflop, bytes_moved;
  double route_ms, dispatch_ms, experts_ms, combine_ms, reduce_ms;
  double check_error, checked_rows;
  double rows, gemm_flops, grouped_ms, dense_ms;
  double rows_used, used_flops;  // the expert rows in use, and their GEMM FLOPs
};

Tensor rows_of(const Tensor& x, int begin, int rows) {
  const size_t row_bytes = size_t(x.size(1)) * dtype_size(x.dtype());
  return Tensor(static_cast<std::byte*>(x.data()) + size_t(begin) * row_bytes, x.dtype(),
                {rows, x.size(1)});
}

void fill_pattern(const Buffer& b) {
  float* p = b.data<float>();
  const size_t n = b.nbytes() / sizeof(float);
  for (size_t i = 0; i < n; ++i) p[i] = float((uint32_t(i) * 2654435761u) >> 24) / 256.0f - 0.5f;
}

// Times the dense GEMM pair of the same FLOPs as this rank's expert stage; returns its median ms.
double time_dense_gemms(Communicator& comm, const MoeRunSpec& spec, int64_t rows) {
  const MoeConfig& c = spec.config;
  const int H = c.hidden_dim, F = c.ffn_dim, O = c.out_dim(), G = c.w1_halves() * F;
  const int64_t m = std::max<int64_t>(rows, 0);
  Buffer a(DType::f32, {m, H}), w1(DType::f32, {H, G}), w2(DType::f32, {F, O});
  Buffer hidden(DType::f32, {m, G}), out(DType::f32, {m, O});
  fill_pattern(a);
  fill_pattern(w1);
  fill_pattern(w2);
  std::vector<double> mine;
  auto step = [&] {
    const auto start = Clock::now();
    cpu::gemm_f32(int(m), G, H, a.data<float>(), H, w1.data<float>(), G, hidden.data<float>(), G);
    cpu::gemm_f32(int(m), O, F, hidden.data<float>(), G, w2.data<float>(), O, out.data<float>(), O);
    mine.push_back(ms_since(start));
  };
  time_steps(comm, spec.warmup, spec.iters, {step});
  return median_of(std::vector<double>(mine.end() - spec.iters, mine.end()));
}

// The device memory in use while this run's layers exist, on GPU 0 shared by the thread ranks.
// Collective: start() before any rank builds its layer, sample() once they are built and again
// after the timed forwards, each with every rank past the allocations it waits on.
class DeviceMemoryPeak {
 public:
  void start(Communicator& comm, Device device) {
    device_ = device;
    comm.barrier();  // the previous run's memory is freed
    if (comm.rank() == 0) detail::device_runtime().reset_memory_peak(device);
    before_ = detail::device_runtime().memory_use(device).in_use;  // nobody allocates here
    comm.barrier();
  }
  void sample(Communicator& comm) {
    comm.barrier();
    const detail::DeviceMemoryUse use = detail::device_runtime().memory_use(device_);
    most_ = std::max({most_, use.peak, use.in_use});
    comm.barrier();
  }
  // Bytes above the start, shared over the ranks that hold a layer.
  double per_rank(int holders) const {
    return double(most_ > before_ ? most_ - before_ : 0) / std::max(1, holders);
  }

 private:
  Device device_;
  size_t before_ = 0, most_ = 0;
};

void run_rank(Communicator& comm, const MoeRunSpec& spec, const Tensor& x,
              const reference::MoeExpected& expected, std::vector<RankReport>& reports,
              std::vector<double>& iteration_ms, std::string& expert_gemm) {
  const MoeConfig& c = spec.config;
  const int W = comm.size(), rank = comm.rank();
  const bool ep = spec.variant == MoeVariantKind::ep;
  const bool on_device = spec.device.kind != Device::Kind::cpu;
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  if (launched_by_mpi()) {
    const int local = int(comm.node_ranks().size());
    cpu::set_blas_threads(spec.blas_threads > 0                    ? spec.blas_threads
                          : spec.variant == MoeVariantKind::simple ? cores
                                                                   : std::max(1, cores / local));
    reset_peak_rss();
  }

  reset_thread_peak();
  const int64_t base = thread_memory().current_bytes;
  DeviceMemoryPeak device_memory;
  if (on_device) device_memory.start(comm, spec.device);
  const RowRange mine = ep ? shard_rows(spec.batch, W, rank) : RowRange{0, spec.batch};
  Layer layer;
  switch (spec.variant) {
    case MoeVariantKind::simple:
      if (rank == 0)
        layer.simple = on_device ? std::make_unique<SimpleMoe>(c, std::max(1, spec.batch),
                                                               spec.device, comm.stream())
                                 : std::make_unique<SimpleMoe>(c, std::max(1, spec.batch));
      break;
    case MoeVariantKind::tp:
      layer.tp = std::make_unique<TpMoe>(comm, c, std::max(1, spec.batch));
      break;
    case MoeVariantKind::ep:
      layer.ep = std::make_unique<EpMoe>(comm, c, std::max(1, shard_rows(spec.batch, W, 0).size()),
                                         spec.micro_batches);
      break;
  }
  const Tensor x_host = rows_of(x, mine.begin, mine.size());
  const int y_rows = layer.active() ? mine.size() : 0;
  Buffer y(c.dtype, {y_rows, c.out_dim()});
  Buffer x_device, y_device;  // --device cuda: the layer's input and output live there
  if (on_device) {
    x_device = Buffer(c.dtype, {mine.size(), c.hidden_dim}, spec.device);
    y_device = Buffer(c.dtype, {y_rows, c.out_dim()}, spec.device);
    copy(x_device, x_host);
    device_memory.sample(comm);
  }
  const Tensor x_mine = on_device ? Tensor(x_device) : x_host;
  const Tensor y_out = on_device ? Tensor(y_device) : Tensor(y);
  auto forward_once = [&] {
    layer.forward(x_mine, y_out);
    if (on_device) synchronize(comm.stream());
  };

  // The check: the first forward must match the reference on every rank.
  RankReport report{};
  std::string error;
  if (layer.active()) {
    forward_once();
    if (on_device) copy(y, y_device);
    const auto cmp =
        reference::compare_moe(c, expected, y, mine.begin, reference::moe_tolerance(c.dtype));
    error = cmp.error;
    report.check_error = cmp.max_error;
    report.checked_rows = cmp.compared;
  }
  const char failed = error.empty() ? 0 : 1;
  const auto votes = comm.all_gather(std::as_bytes(std::span(&failed, 1)));
  for (int r = 0; r < W; ++r)
    PMOE_CHECK(votes[size_t(r)] == std::byte{0}, "moe check failed: ", variant_key(spec.variant),
               " batch=", spec.batch, " top_k=", c.top_k, " hidden_dim=", c.hidden_dim,
               (r == rank ? ": " + error : " on rank " + std::to_string(r)));

  std::vector<MoeStats> per_iteration;
  auto forward = [&] {
    if (!layer.active()) return;
    forward_once();
    per_iteration.push_back(layer.stats());
  };
  iteration_ms = time_steps(comm, spec.warmup, spec.iters, {forward})[0];
  for (double& t : iteration_ms) t /= 1000.0;  // µs -> ms

  report.peak_bytes = double(thread_memory().peak_bytes - base);
  if (on_device) {
    device_memory.sample(comm);
    const int holders = spec.variant == MoeVariantKind::simple ? 1 : W;
    report.peak_bytes = layer.active() ? device_memory.per_rank(holders) : 0;
  }
  if (layer.active()) {
    const std::vector<MoeStats> timed(per_iteration.end() - spec.iters, per_iteration.end());
    auto phase_ms = [&](double MoeStats::*field) {
      std::vector<double> v;
      for (const MoeStats& s : timed) v.push_back(1e3 * (s.*field));
      return median_of(v);
    };
    const MoeStats& last = timed.back();
    expert_gemm = last.expert_gemm;
    report.weight_bytes = double(layer.weight_bytes());
    report.workspace_bytes = double(layer.workspace_bytes());
    report.gflop = (last.expert_flops + last.router_flops) / 1e9;
    report.bytes_moved = double(last.bytes_moved);
    report.route_ms = phase_ms(&MoeStats::route_s);
    report.dispatch_ms = phase_ms(&MoeStats::dispatch_s);
    report.experts_ms = phase_ms(&MoeStats::experts_s);
    report.combine_ms = phase_ms(&MoeStats::combine_s);
    report.reduce_ms = phase_ms(&MoeStats::reduce_s);
    report.rows = double(last.expert_rows);
    report.gemm_flops = last.expert_flops;
    report.rows_used = double(last.expert_rows_used);
    report.used_flops =
        last.expert_rows > 0 ? last.expert_flops * double(last.expert_rows_used) / double(last.expert_rows) : 0;
    report.grouped_ms = report.experts_ms;
  }
  layer = Layer();  // free the model before the dense GEMMs allocate theirs
  if (ep && spec.gemm_rate && !on_device) report.dense_ms = time_dense_gemms(comm, spec, int64_t(report.rows));
  report.rss_bytes = double(peak_rss_bytes());

  const auto all = comm.all_gather(std::as_bytes(std::span(&report, 1)));
  reports.resize(size_t(W));
  std::memcpy(reports.data(), all.data(), all.size());
}

}  // namespace

MoeRunResult run_moe_variant(const MoeRunSpec& spec, const Tensor& x,
                             const reference::MoeExpected& expected) {
  const bool mpi = launched_by_mpi();
  const bool simple = spec.variant == MoeVariantKind::simple;
  const int W = simple && !mpi ? 1 : spec.ranks;
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  if (!mpi) {
    cpu::set_blas_threads(spec.blas_threads > 0 ? spec.blas_threads
                          : simple              ? cores
                                                : std::max(1, cores / W));
    reset_peak_rss();
  }
  MoeRunResult result;
  std::mutex mutex;
  auto body = [&](Communicator& comm) {
    std::vector<RankReport> reports;
    std::vector<double> iteration_ms;
    std::string expert_gemm;
    run_rank(comm, spec, x, expected, reports, iteration_ms, expert_gemm);
    if (comm.rank() != 0) return;
    std::lock_guard lock(mutex);
    result.ms = summarize(iteration_ms);
    result.ranks = comm.size();
    result.expert_gemm = expert_gemm;
    result.blas_threads = cpu::blas_threads();
    const int E_local = spec.config.num_experts / comm.size();
    double issued = 0, used = 0, used_flops = 0;
    for (int r = 0; r < comm.size(); ++r) {
      const RankReport& p = reports[size_t(r)];
      result.max_mem_mb = std::max(result.max_mem_mb, p.peak_bytes / 1e6);
      result.weights_mb = std::max(result.weights_mb, p.weight_bytes / 1e6);
      result.workspace_mb = std::max(result.workspace_mb, p.workspace_bytes / 1e6);
      result.rss_mb = std::max(result.rss_mb, p.rss_bytes / 1e6);
      result.gflop_max = std::max(result.gflop_max, p.gflop);
      result.mb_moved_max = std::max(result.mb_moved_max, p.bytes_moved / 1e6);
      result.route_ms = std::max(result.route_ms, p.route_ms);
      result.dispatch_ms = std::max(result.dispatch_ms, p.dispatch_ms);
      result.experts_ms = std::max(result.experts_ms, p.experts_ms);
      result.combine_ms = std::max(result.combine_ms, p.combine_ms);
      result.reduce_ms = std::max(result.reduce_ms, p.reduce_ms);
      result.check_error = std::max(result.check_error, p.check_error);
      result.checked_rows += int(p.checked_rows);
      issued += p.rows;
      used += p.rows_used;
      used_flops += p.used_flops;
      if (spec.variant == MoeVariantKind::ep && spec.gemm_rate)
        result.gemm_rates.push_back(
            {r, int64_t(p.rows), E_local, p.gemm_flops / 1e9, p.grouped_ms, p.dense_ms});
    }
    result.issued_per_used = used > 0 ? issued / used : 0;
    result.gemm_tflops = result.experts_ms > 0 ? used_flops / (result.experts_ms * 1e-3) / 1e12 : 0;
  };
  PMOE_CHECK(!mpi || spec.device.kind == Device::Kind::cpu,
             "pmoe-bench moe --device cuda runs thread ranks on GPU 0 (the layers across MPI "
             "processes on GPUs are not tested yet); under mpirun, use --device cpu");
  run_on_ranks(mpi ? 0 : W, body, spec.device);
  return result;
}

}  // namespace pmoe::bench
