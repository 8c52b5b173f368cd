#include "bench_common.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>

#include "core/device_runtime.hpp"
#include "pmoe/error.hpp"
#include "pmoe/mpi_communicator.hpp"

namespace pmoe::bench {

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
         std::getenv("PMIX_RANK");
}

std::vector<int> rank_counts_to_run(bool given, const std::vector<int>& ranks) {
  if (!launched_by_mpi()) return ranks;
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::string listed;
  for (int r : ranks) listed += (listed.empty() ? "" : ",") + std::to_string(r);
  PMOE_CHECK(!given || ranks == std::vector<int>{world}, "--ranks ", listed,
             " under mpirun, which started ", world, " processes: under mpirun the ranks are the ",
             "processes; leave --ranks out, or pass --ranks ", world,
             ", or run without mpirun for thread ranks");
  return {world};
}

bool is_printing_rank() {
  if (!launched_by_mpi()) return true;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank == 0;
}

namespace {

// This process's GPU under mpirun: its index among the processes of its node.
Device gpu_of_this_process() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local_rank = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  const int gpus = detail::device_runtime().device_count();
  PMOE_CHECK(gpus >= 1, "--device cuda: no CUDA device visible to this process");
  return Device::cuda(local_rank % gpus);
}

// The CUDA device this process's ranks ran on, for the machine record (-1: none).
std::atomic<int> cuda_device_used{-1};

}  // namespace

void run_on_ranks(int ranks, const std::function<void(Communicator&)>& fn, Device device) {
  if (device.kind == Device::Kind::cuda) cuda_device_used = device.index;
  if (!launched_by_mpi()) return run_ranks(ranks, fn, device);
  if (device.kind == Device::Kind::cuda) cuda_device_used = (device = gpu_of_this_process()).index;
  MpiCommunicator comm(MPI_COMM_WORLD, device);
  PMOE_CHECK(ranks == 0 || ranks == comm.size(), "--ranks ", ranks,
             " differs from the ", comm.size(), " MPI processes; under mpirun, ranks are the "
             "processes");
  fn(comm);
}

Stats summarize(std::vector<double> samples) {
  Stats s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  s.min = samples.front();
  s.max = samples.back();
  s.median = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / double(n);
  double squares = 0;
  for (double v : samples) squares += (v - s.mean) * (v - s.mean);
  s.std = n > 1 ? std::sqrt(squares / double(n - 1)) : 0.0;
  return s;
}

std::vector<std::vector<double>> time_steps(Communicator& comm, int warmup, int iters,
                                            const std::vector<std::function<void()>>& steps) {
  using Clock = std::chrono::steady_clock;
  const size_t n_steps = steps.size(), n_iters = size_t(iters);
  for (int i = 0; i < warmup; ++i) {
    for (const auto& step : steps) {
      comm.barrier();
      step();
    }
  }
  std::vector<double> mine(n_steps * n_iters);  // [step][iteration]
  for (size_t i = 0; i < n_iters; ++i) {
    for (size_t s = 0; s < n_steps; ++s) {
      comm.barrier();
      const auto start = Clock::now();
      steps[s]();
      mine[s * n_iters + i] =
          std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    }
  }
  const auto all = comm.all_gather(std::as_bytes(std::span(mine)));
  const auto* times = reinterpret_cast<const double*>(all.data());
  std::vector<std::vector<double>> slowest(n_steps, std::vector<double>(n_iters, 0.0));
  for (int r = 0; r < comm.size(); ++r)
    for (size_t s = 0; s < n_steps; ++s)
      for (size_t i = 0; i < n_iters; ++i)
        slowest[s][i] = std::max(slowest[s][i], times[size_t(r) * mine.size() + s * n_iters + i]);
  return slowest;
}

std::string git_commit() {
  const std::string command = std::string("git -C '") + PMOE_SOURCE_DIR +
                              "' rev-parse --short=12 HEAD 2>/dev/null";
  std::string out;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char line[64] = {};
    if (fgets(line, sizeof line, pipe)) out = line;
    pclose(pipe);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

std::string shm_huge_pages() {
  // shmem_enabled governs the kernel's internal mount; its force and deny override every tmpfs.
  std::ifstream setting("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string text;
  std::getline(setting, text);
  const size_t open = text.find('['), close = text.find(']');
  if (open != std::string::npos && close > open) {
    const std::string global = text.substr(open + 1, close - open - 1);
    if (global == "force" || global == "deny") return global;
  }
  std::string found = "unknown";  // the last mount at /dev/shm is the one in use
  std::ifstream mounts("/proc/mounts");
  for (std::string line; std::getline(mounts, line);) {
    std::istringstream fields(line);
    std::string device, where, type, options;
    fields >> device >> where >> type >> options;
    if (where != "/dev/shm") continue;
    const size_t huge = options.find("huge=");
    found = huge == std::string::npos
                ? "never"
                : options.substr(huge + 5, options.find(',', huge) - huge - 5);
  }
  return found;
}

nlohmann::json machine_info() {
  std::string cpu = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  // The GPU the ranks ran on, as CUDA names it; "emulated CUDA device" on the emulated one; none
  // where the run used no CUDA device (the CPU backend), without starting CUDA to ask.
  std::string gpu = "none";
  if (const int index = cuda_device_used; index >= 0) {
    try {
      gpu = detail::device_runtime().device_name(Device::cuda(index));
    } catch (const Error& e) {
      gpu = detail::cat("unknown (", e.what(), ")");
    }
  }
  return {{"cpu", cpu},
          {"cores", std::thread::hardware_concurrency()},
          {"gpu", gpu},
          {"host", host},
          {"date", date},
          {"launcher", launched_by_mpi() ? "mpirun" : "threads"},
          {"shm_huge_pages", shm_huge_pages()}};
}

std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> names;
  for (size_t at = 0; at < list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) names.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return names;
}

std::vector<int> parse_int_list(const std::string& text, const char* what) {
  std::vector<int> values;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    PMOE_CHECK(!item.empty() && end && *end == '\0' && v > 0, what,
               ": expected a comma-separated list of positive integers, got '", text, "'");
    values.push_back(int(v));
  }
  PMOE_CHECK(!values.empty(), what, ": empty list");
  return values;
}

}  // namespace pmoe::bench
