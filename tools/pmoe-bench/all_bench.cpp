// `pmoe-bench all`: a quick pass of every benchmark, the README's main-job command (make bench).
// Each part runs as its own process (this executable again), so one part's failure is reported
// and the others still run; the exit code is non-zero if any part failed its check or crashed.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "pmoe/error.hpp"
#include "subcommands.hpp"

namespace pmoe::bench {
namespace {

struct Options {
  std::string out_dir = "build/bench";
  std::string device = "cpu";  // or cuda: each part on the CUDA backend (the emulated one here)
};

std::string self_path() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  PMOE_CHECK(n > 0, "pmoe-bench all: cannot find its own executable");
  return std::string(path, size_t(n));
}

void run(const Options& o) {
  PMOE_CHECK(!launched_by_mpi(), "pmoe-bench all runs its parts with thread ranks; under mpirun, "
             "run the subcommands themselves");
  PMOE_CHECK(std::system(("mkdir -p '" + o.out_dir + "'").c_str()) == 0, "cannot create ",
             o.out_dir);
  PMOE_CHECK(o.device == "cpu" || o.device == "cuda", "--device must be cpu or cuda, got '",
             o.device, "'");
  const std::string self = self_path(), dir = o.out_dir;
  const std::string on = " --device " + o.device;
  const std::vector<std::pair<std::string, std::string>> parts = {
      {"all-to-all", "all-to-all --ranks 2 --tokens 1,128 --json " + dir + "/all_to_all.json" + on},
      {"moe", "moe --benchmark_type batch_size --json " + dir + "/moe_batch_size.json" + on},
      {"ag-gemm", "ag-gemm --ranks 2 --json " + dir + "/ag_gemm.json" + on},
      {"gemm-rs", "gemm-rs --ranks 2 --json " + dir + "/gemm_rs.json" + on},
  };
  std::vector<std::string> failed;
  for (const auto& [name, args] : parts) {
    std::printf("\n# pmoe-bench %s\n", args.c_str());
    std::fflush(stdout);
    if (std::system(("'" + self + "' " + args).c_str()) != 0) failed.push_back(name);
  }
  std::printf("\n%zu of %zu benchmarks passed their checks; JSON in %s\n",
              parts.size() - failed.size(), parts.size(), dir.c_str());
  if (!failed.empty()) {
    std::string names;
    for (const auto& f : failed) names += (names.empty() ? "" : ", ") + f;
    throw Error("pmoe-bench all: failed: " + names);
  }
}

}  // namespace

void add_all_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("all", "a quick pass of every benchmark (make bench)");
  cmd->add_option("--out", o->out_dir, "where the JSON results go")->capture_default_str();
  cmd->add_option("--device", o->device,
                  "cpu, or cuda: the parts on the CUDA backend (on the emulated device where no "
                  "GPU is visible: checked, times labelled emulation)")
      ->capture_default_str();
  cmd->callback([o] { run(*o); });
}

}  // namespace pmoe::bench
