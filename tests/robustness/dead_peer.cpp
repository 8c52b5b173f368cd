// Topology: 4 MPI processes on one node (mpiexec --enable-recovery, so that the launcher lets the
// survivors run on after one dies), shared-memory transport. The last rank SIGKILLs itself at a
// random moment while every rank loops over checked AllToAll dispatch/combine calls. Each
// survivor must fail with a pmoe::Error that names the dead rank and its pid, within 1 s of the
// kill. Every rank prints one line that run_dead_peer.sh checks:
//   "dead-peer: rank R ok <latency ms> <message>" or "dead-peer: rank R FAIL <why>".
// Survivors leave with _exit(): MPI cannot finalize with a dead peer.
#include <mpi.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "all_to_all_cases.hpp"
#include "killed_rank.hpp"
#include "pmoe/error.hpp"
#include "pmoe/mpi_communicator.hpp"

namespace {

using pmoe::testing::monotonic_ns;

[[noreturn]] void leave(int rank, bool ok, const std::string& text) {
  pmoe::testing::leave("dead-peer", rank, ok, text);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 2) leave(rank, false, "usage: dead_peer STAMP_FILE");
  const std::string stamp_file = argv[1];
  const int victim = size - 1;

  pmoe::MpiCommunicator comm(MPI_COMM_WORLD);
  pmoe::testing::AllToAllCase c;
  c.config = pmoe::testing::make_config(/*max_tokens=*/16, /*experts=*/2 * size, /*top_k=*/2,
                                        /*hidden=*/64);
  c.calls = 1 << 30;  // until the victim dies
  c.seed = 7;

  if (rank == victim) {
    // Dies at a random moment 100..400 ms after set-up, in whatever call it is in.
    std::srand(unsigned(getpid()));
    const int delay_ms = 100 + std::rand() % 300;
    pmoe::testing::kill_self_after(delay_ms, stamp_file);
  }
  try {
    const auto result = pmoe::testing::run_all_to_all_case(comm, c);
    leave(rank, false, "the loop ended without an error: " + result.error);
  } catch (const pmoe::Error& e) {
    const int64_t noticed = monotonic_ns();
    if (rank == victim) leave(rank, false, std::string("the victim itself failed: ") + e.what());
    const int64_t killed = pmoe::testing::kill_stamp(stamp_file);
    if (killed == 0) leave(rank, false, std::string("error before the kill: ") + e.what());
    const double latency_ms = double(noticed - killed) / 1e6;
    const std::string message = e.what();
    // "the process of rank 3 (pid N) has ended", or "the processes of ranks 1 (pid N), 3 (pid M)
    // have ended" where survivors that left already are named too.
    const std::string named = " " + std::to_string(victim) + " (pid ";
    if (message.find(named) == std::string::npos)
      leave(rank, false, "the error does not name rank " + std::to_string(victim) +
                             " and its pid: " + message);
    if (latency_ms > 1000)
      leave(rank, false, "noticed " + std::to_string(latency_ms) + " ms after the kill: " + message);
    leave(rank, true, std::to_string(latency_ms) + " ms: " + message);
  } catch (const std::exception& e) {
    leave(rank, false, std::string("not a pmoe::Error: ") + e.what());
  }
}
