// What every pmoe-bench subcommand shares: where the ranks come from (threads, or the MPI
// processes when launched under mpirun), the timing protocol, statistics and the machine record.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pmoe/comm.hpp"

namespace pmoe::bench {

// True when this process was started by mpirun / mpiexec (Open MPI, MPICH or PMI launchers).
bool launched_by_mpi();

// Runs fn on `ranks` thread ranks, or, under mpirun, on this process's MPI rank (then `ranks`
// must be the MPI world size or 0). MPI is initialised by main(). With a CUDA `device`, thread
// ranks share that GPU; MPI processes are spread over their node's GPUs as launchers place them
// (GPU = index among the node's processes, modulo the GPUs visible).
void run_on_ranks(int ranks, const std::function<void(Communicator&)>& fn,
                  Device device = Device::cpu());

// The rank counts to run: `ranks` with thread ranks; under mpirun the number of MPI processes,
// which --ranks, when `given`, must name (anything else is an error, not silently ignored).
std::vector<int> rank_counts_to_run(bool given, const std::vector<int>& ranks);

// Rank 0 prints; under MPI the other processes stay quiet.
bool is_printing_rank();

struct Stats {
  double min = 0, median = 0, max = 0, mean = 0, std = 0;
};
Stats summarize(std::vector<double> samples);

// The measurement protocol: `warmup` untimed iterations, then `iters` timed ones. An iteration
// runs every step in order, each step preceded by a barrier and timed on its own; a step's time
// in an iteration is the slowest rank's. Collective; every rank gets the same result:
// times[step][iteration], in microseconds.
std::vector<std::vector<double>> time_steps(Communicator& comm, int warmup, int iters,
                                            const std::vector<std::function<void()>>& steps);

// CPU model, cores, GPU (the model of the CUDA device run_on_ranks last ran on, as
// cudaGetDeviceProperties names it, "emulated CUDA device" on the emulated one, "none" where no
// CUDA device ran), host, date, launcher, and whether shared memory may use huge pages: recorded
// with every result.
nlohmann::json machine_info();
std::string git_commit();
// Whether POSIX shared memory may use huge pages: the huge= option of the tmpfs at /dev/shm
// (never where it has none: Debian's default), or shmem_enabled's force or deny, which override
// it. MPI ranks' buffers lie there (docs/benchmarks.md, "MPI ranks").
std::string shm_huge_pages();

// Parses "2,4,8" into {2, 4, 8}; throws pmoe::Error on anything else.
std::vector<int> parse_int_list(const std::string& text, const char* what);

// "a,b" -> {"a", "b"}; "" -> {}.
std::vector<std::string> split_names(const std::string& list);

}  // namespace pmoe::bench
