// `pmoe-bench model calibrate`: measures this machine's links (per-core copy bandwidth with every
// core copying, a signal's round trip between two threads through shared memory, a TCP loopback
// round trip and stream bandwidth, and AllToAll's fixed cost per call on one rank), writes them
// as a preset file, then runs pmoe's AllToAll on thread ranks (EP2..EP8, 1 and 128 tokens; each
// configuration checked against the reference first) and prints predicted (predict_cpu, from
// count_traffic on the same routing) against measured, per row, in the same run.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "model_bench.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/error.hpp"
#include "reference/all_to_all_reference.hpp"
#include "report.hpp"

namespace pmoe::bench {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// GB/s of (read + written) bytes per thread, `threads` threads copying `bytes` each at once
// (16 MiB: from memory; a quarter of L2: from cache).
double copy_gbps(int threads, size_t kBytes) {
  std::vector<double> per_thread(threads);
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i)
    pool.emplace_back([&, i] {
      std::vector<char> from(kBytes, 1), to(kBytes);
      std::vector<double> times;
      const int reps = kBytes >= (size_t(1) << 20) ? 30 : 2000;
      for (int rep = 0; rep < reps; ++rep) {
        const auto t = Clock::now();
        std::memcpy(to.data(), from.data(), kBytes);
        times.push_back(us_since(t));
      }
      per_thread[i] = 2.0 * kBytes / (median(times) * 1e3);
    });
  for (auto& t : pool) t.join();
  return median(per_thread);
}

// Round trip of a flag between two threads through shared memory (µs).
double shared_memory_round_trip_us() {
  std::atomic<uint64_t> ping{0}, pong{0};
  constexpr int kTrips = 20000;
  std::thread echo([&] {
    for (uint64_t i = 1; i <= kTrips; ++i) {
      while (ping.load(std::memory_order_acquire) != i) std::this_thread::yield();
      pong.store(i, std::memory_order_release);
    }
  });
  const auto t = Clock::now();
  for (uint64_t i = 1; i <= kTrips; ++i) {
    ping.store(i, std::memory_order_release);
    while (pong.load(std::memory_order_acquire) != i) std::this_thread::yield();
  }
  const double us = us_since(t) / kTrips;
  echo.join();
  return us;
}

// TCP over loopback: round trip of 8 bytes (µs) and one-way stream bandwidth (GB/s).
std::pair<double, double> tcp_loopback() {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  PMOE_CHECK(listener >= 0, "calibrate: socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  PMOE_CHECK(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                 listen(listener, 1) == 0 &&
                 getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0,
             "calibrate: cannot listen on loopback");
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  PMOE_CHECK(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0,
             "calibrate: cannot connect on loopback");
  const int server = accept(listener, nullptr, nullptr);
  const int one = 1;
  setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto full = [](int fd, char* p, size_t n, bool out) {
    while (n) {
      const ssize_t k = out ? send(fd, p, n, 0) : recv(fd, p, n, 0);
      PMOE_CHECK(k > 0, "calibrate: loopback socket failed");
      p += k, n -= size_t(k);
    }
  };
  constexpr int kTrips = 5000;
  constexpr size_t kStream = size_t(64) << 20, kChunk = size_t(1) << 20;
  std::thread echo([&] {
    char word[8];
    for (int i = 0; i < kTrips; ++i) full(server, word, 8, false), full(server, word, 8, true);
    std::vector<char> sink(kChunk);
    for (size_t got = 0; got < kStream; got += kChunk) full(server, sink.data(), kChunk, false);
    full(server, word, 1, true);
  });
  char word[8] = {};
  auto t = Clock::now();
  for (int i = 0; i < kTrips; ++i) full(client, word, 8, true), full(client, word, 8, false);
  const double round_trip = us_since(t) / kTrips;
  std::vector<char> chunk(kChunk, 1);
  t = Clock::now();
  for (size_t sent = 0; sent < kStream; sent += kChunk) full(client, chunk.data(), kChunk, true);
  full(client, word, 1, false);
  const double gbps = double(kStream) / (us_since(t) * 1e3);
  echo.join();
  close(client), close(server), close(listener);
  return {round_trip, gbps};
}

struct Options {
  ModelShape shape;
  std::string ranks = "2,4,8", tokens = "1,128";
  int iters = 20, warmup = 3;
  uint64_t seed = 1;
  std::string preset_path = "model-preset-cpu.json", json_path;
  std::string preset_file;   // under mpirun: the links, from a thread-rank run's preset
  bool ranks_given = false;  // --ranks on the command line (under mpirun it must match)
};

AllToAllConfig run_config(const Options& o, int tokens) {
  AllToAllConfig c = model_config(o.shape, 1, tokens);
  c.in_place_buffers = true;
  return c;
}

struct Measured {
  double dispatch_us = 0, combine_us = 0;
  std::vector<std::vector<int32_t>> indices;
};

// pmoe-bench all-to-all's pmoe rows (in-place buffers, Phase::both), checked first.
Measured measure(const Options& o, int W, int tokens) {
  const AllToAllConfig cfg = run_config(o, tokens);
  std::vector<reference::AllToAllInputs> all;
  for (int r = 0; r < W; ++r)
    all.push_back(reference::make_inputs(cfg, r, tokens, o.seed, reference::Routing::random));
  Measured out;
  for (const auto& in : all)
    out.indices.emplace_back(in.indices.data<int32_t>(),
                             in.indices.data<int32_t>() + size_t(in.m) * cfg.top_k);
  std::mutex lock;
  std::string failure;
  run_on_ranks(W, [&](Communicator& comm) {
    const int rank = comm.rank(), E_local = cfg.num_experts / W, H = cfg.hidden_dim;
    const auto& in = all[size_t(rank)];
    AllToAll a2a(comm, cfg);
    Buffer counts(DType::i32, {E_local});
    Buffer expert_x(cfg.in_dtype, {E_local, int64_t(W) * tokens, H});
    const Tensor expert_y = a2a.expert_output_buffer();
    Buffer y(cfg.out_dtype, {tokens, H});
    const Tensor x(a2a.input_buffer().data(), cfg.in_dtype, {tokens, H});
    std::memcpy(x.data(), in.x.data<void>(), in.x.nbytes());
    auto dispatch = [&] { a2a.dispatch(x, Tensor(), in.indices, counts, expert_x, Tensor()); };
    auto combine = [&] { a2a.combine(expert_y, in.indices, in.weights, y); };
    std::memset(expert_x.data<void>(), 0xA5, expert_x.nbytes());
    dispatch();
    std::string error = reference::compare_dispatch(
        cfg, W, reference::reference_dispatch(cfg, W, rank, all), counts, expert_x, Tensor(), 0xA5);
    reference::run_fake_experts(cfg, W, rank, counts, expert_x, Tensor(), expert_y);
    combine();
    if (error.empty())
      error =
          reference::compare_bytes("y", y, reference::reference_combine(cfg, in, cfg.out_dtype));
    if (!error.empty()) {
      std::lock_guard<std::mutex> g(lock);
      failure = detail::cat("rank ", rank, ": ", error);
    }
    const auto times = time_steps(comm, o.warmup, o.iters, {dispatch, combine});
    if (rank == 0) {
      out.dispatch_us = summarize(times[0]).median;
      out.combine_us = summarize(times[1]).median;
    }
  });
  PMOE_CHECK(failure.empty(), "calibrate: AllToAll at EP", W, ", ", tokens,
             " tokens did not match the reference: ", failure);
  return out;
}

// This machine's links, measured now (the machine is shared: each row is predicted from a
// measurement taken right before it).
HardwarePreset measure_links(const Options& o) {
  HardwarePreset hw;
  hw.name = "this-machine";
  const json machine = machine_info();
  hw.cores = int(std::max(1u, std::thread::hardware_concurrency()));
  hw.description = detail::cat("measured by pmoe-bench model calibrate, ", hw.cores, " cores, ",
                               machine.value("cpu", std::string("cpu?")));
  hw.ranks_per_node = 1024;  // thread ranks: every peer over shared memory
  const double per_core = copy_gbps(hw.cores, size_t(16) << 20);
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  hw.cache_bytes = double(l2 > 0 ? l2 : 256 << 10);
  hw.cache_gbps = copy_gbps(hw.cores, size_t(hw.cache_bytes) / 4);
  const double signal = shared_memory_round_trip_us();
  const auto [tcp_rt, tcp_gbps] = tcp_loopback();
  hw.links[int(detail::Link::same_rank)] = {per_core, 0, 0};
  hw.links[int(detail::Link::load_store)] = {per_core, signal / 2, 0};
  hw.links[int(detail::Link::network)] = {tcp_gbps, tcp_rt / 2, 0};
  hw.local_gbps = per_core;
  hw.signal_us = signal;
  hw.kernels_per_op = 1;
  const Measured one = measure(o, 1, 1);
  hw.call_us = (one.dispatch_us + one.combine_us) / 2;
  // The sum's rate: combine on one rank with 128 tokens (every row local, past the cache).
  {
    const Measured big = measure(o, 1, 128);
    const AllToAllConfig cfg = run_config(o, 128);
    const auto t =
        detail::count_traffic(cfg, {1, 1, detail::TrafficMode::direct, false}, big.indices);
    const double row = double(cfg.hidden_dim) * dtype_size(cfg.out_dtype);
    const double bytes = double(t.combine.ranks[0].rows) * row + 128 * row;
    hw.reduce_gbps = bytes / (std::max(big.combine_us - hw.call_us, 1.0) * 1e3);
  }
  return hw;
}

// Under mpirun the MPI processes are the ranks (one W: the world size). The links come from a
// preset file a thread-rank run wrote (--preset-file): measuring them here would have every
// process copy at once, and the fixed cost per call needs a 1-rank run.
void run_mpi(const Options& o) {
  PMOE_CHECK(!o.preset_file.empty(),
             "model calibrate under mpirun needs --preset-file (written by a run without mpirun)");
  const HardwarePreset hw = load_preset(o.preset_file);
  const int W = rank_counts_to_run(o.ranks_given, parse_int_list(o.ranks, "--ranks")).at(0);
  if (is_printing_rank())
    std::printf(
        "## pmoe-bench model calibrate under mpirun: %d MPI processes, commit %s, links "
        "from %s\n\n| op | EP | tokens | predicted µs | measured µs | predicted/measured "
        "|\n|---|---:|---:|---:|---:|---:|\n",
        W, git_commit().c_str(), o.preset_file.c_str());
  json rows = json::array();
  for (int tokens : parse_int_list(o.tokens, "--tokens")) {
    const Measured m = measure(o, W, tokens);
    const AllToAllConfig cfg = run_config(o, tokens);
    const auto traffic =
        detail::count_traffic(cfg, {W, W, detail::TrafficMode::direct, false}, m.indices);
    const double slot = double(cfg.hidden_dim) * dtype_size(cfg.in_dtype);
    const double y_row = double(cfg.hidden_dim) * dtype_size(cfg.out_dtype);
    const Prediction p = predict_cpu(hw, traffic, slot, y_row, tokens, y_row);
    if (!is_printing_rank()) continue;
    for (const auto& [op, pred, meas] : {std::tuple{"dispatch", p.dispatch.us, m.dispatch_us},
                                         std::tuple{"combine", p.combine.us, m.combine_us}}) {
      std::printf("| %s | %d | %d | %.1f | %.1f | %.2f |\n", op, W, tokens, pred, meas,
                  pred / meas);
      rows.push_back({{"op", op},
                      {"ranks", W},
                      {"tokens", tokens},
                      {"predicted_us", pred},
                      {"measured_us", meas},
                      {"ratio", pred / meas}});
    }
    std::fflush(stdout);
  }
  if (!o.json_path.empty() && is_printing_rank())
    write_json(o.json_path, {{"shape", o.shape.to_json()}, {"iters", o.iters}, {"mpi", true}}, rows,
               {{"preset", hw.to_json()}});
}

void run(const Options& o) {
  PMOE_CHECK(parse_dtype(o.shape.dtype) != DType::f8e4m3,
             "model calibrate: --dtype bf16, f16 or f32 (the run passes no scales)");
  if (launched_by_mpi()) return run_mpi(o);
  const HardwarePreset hw = measure_links(o);
  const double per_core = hw.links[int(detail::Link::load_store)].gbps, signal = hw.signal_us;
  const double tcp_rt = hw.links[int(detail::Link::network)].latency_us * 2,
               tcp_gbps = hw.links[int(detail::Link::network)].gbps;
  {
    std::ofstream out(o.preset_path);
    PMOE_CHECK(out, "--preset-out: cannot write ", o.preset_path);
    out << hw.to_json().dump(2) << "\n";
  }
  std::printf("## pmoe-bench model calibrate: commit %s, %s\n\n", git_commit().c_str(),
              hw.description.c_str());
  std::printf(
      "- copy bandwidth, per core with %d cores copying (read + written): %.2f GB/s from memory "
      "(16 MiB), %.2f GB/s in cache (a quarter of L2, %.0f KiB)\n"
      "- signal round trip through shared memory (two threads): %.3f µs\n"
      "- TCP loopback: round trip %.1f µs, stream %.2f GB/s\n"
      "- AllToAll fixed cost per call, 1 rank, 1 token: %.1f µs; combine's sum, 1 rank, 128 "
      "tokens: %.2f GB/s\n"
      "- preset written to %s\n\n",
      hw.cores, per_core, hw.cache_gbps, hw.cache_bytes / 4 / 1024, signal, tcp_rt, tcp_gbps,
      hw.call_us, hw.reduce_gbps, o.preset_path.c_str());
  std::printf(
      "Predicted (predict_cpu on count_traffic of the same routing) vs measured (median "
      "of %d, thread ranks, in-place buffers):\n\n| op | EP | tokens | predicted µs | "
      "measured µs | predicted/measured | links just before (copy GB/s memory / cache, signal µs, "
      "call µs, sum GB/s) |\n|---|---:|---:|---:|---:|---:|---|\n",
      o.iters);
  json rows = json::array();
  for (int tokens : parse_int_list(o.tokens, "--tokens"))
    for (int W : parse_int_list(o.ranks, "--ranks")) {
      const HardwarePreset now = measure_links(o);
      const Measured m = measure(o, W, tokens);
      const AllToAllConfig cfg = run_config(o, tokens);
      const auto traffic =
          detail::count_traffic(cfg, {W, W, detail::TrafficMode::direct, false}, m.indices);
      const double slot = double(cfg.hidden_dim) * dtype_size(cfg.in_dtype);
      const double y_row = double(cfg.hidden_dim) * dtype_size(cfg.out_dtype);
      const Prediction p = predict_cpu(now, traffic, slot, y_row, tokens, y_row);
      for (const auto& [op, pred, meas] : {std::tuple{"dispatch", p.dispatch.us, m.dispatch_us},
                                           std::tuple{"combine", p.combine.us, m.combine_us}}) {
        std::printf("| %s | %d | %d | %.1f | %.1f | %.2f | %.1f / %.0f / %.1f / %.1f / %.2f |\n",
                    op, W, tokens, pred, meas, pred / meas,
                    now.links[int(detail::Link::load_store)].gbps, now.cache_gbps, now.signal_us,
                    now.call_us, now.reduce_gbps);
        rows.push_back({{"op", op},
                        {"ranks", W},
                        {"tokens", tokens},
                        {"predicted_us", pred},
                        {"measured_us", meas},
                        {"ratio", pred / meas},
                        {"links", now.to_json()}});
      }
      std::fflush(stdout);
    }
  if (!o.json_path.empty())
    write_json(o.json_path, {{"shape", o.shape.to_json()}, {"iters", o.iters}}, rows,
               {{"preset", hw.to_json()}});
}

}  // namespace

void add_calibrate_command(CLI::App& model) {
  auto o = std::make_shared<Options>();
  o->shape.dtype = "bf16";  // pmoe-bench all-to-all's default run
  CLI::App* cmd = model.add_subcommand(
      "calibrate",
      "measure this machine's links into a preset file, then predicted vs measured "
      "AllToAll on thread ranks");
  add_shape_options(cmd, o->shape);
  cmd->add_option("--ranks", o->ranks, "rank counts, comma-separated")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "tokens per rank, comma-separated")->capture_default_str();
  cmd->add_option("--iters", o->iters, "timed iterations")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed warm-up iterations")->capture_default_str();
  cmd->add_option("--seed", o->seed, "routing and data seed")->capture_default_str();
  cmd->add_option("--preset-out", o->preset_path, "the preset file to write")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "write predicted vs measured as JSON to this file");
  cmd->add_option("--preset-file", o->preset_file,
                  "under mpirun: the links, from a preset file a run without mpirun wrote");
  cmd->callback([o, cmd] {
    o->ranks_given = cmd->get_option("--ranks")->count() > 0;
    PMOE_CHECK(o->iters >= 1 && o->warmup >= 0, "--iters must be >= 1 and --warmup >= 0");
    run(*o);
  });
}

}  // namespace pmoe::bench
