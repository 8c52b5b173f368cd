// Topology: W MPI processes on one node (mpiexec --enable-recovery, so that the launcher lets the
// survivors run on after one dies), shared-memory transport (or one GPU with
// PMOE_TEST_DEVICE=cuda), an AllToAll made with on_peer_loss = mask and a placement that gives
// every expert two slots W / 2 ranks apart. One rank (VICTIM) SIGKILLs itself at a random moment
// while every rank loops over checked dispatch/combine calls: sending, waiting or landing rows,
// whatever it is in. Each survivor must get one pmoe::PeerLost naming the victim, then finish 10
// more calls, each equal to the plain reference with the victim's slots served by their replicas
// (no token lost). Every survivor prints one line that run_peer_loss.sh checks and compares with
// the others':
//   "peer-loss: rank R ok <ms from kill to PeerLost> first=F last=L next=N"
//   "peer-loss: rank R FAIL <why>"
// Survivors leave with _exit(): MPI cannot finalize with a dead peer.
#include <mpi.h>

#include <cstdlib>
#include <random>
#include <string>

#include "all_to_all_cases.hpp"
#include "all_to_all_mask_cases.hpp"
#include "killed_rank.hpp"
#include "pmoe/error.hpp"
#include "pmoe/mpi_communicator.hpp"

namespace {

using pmoe::testing::monotonic_ns;

[[noreturn]] void leave(int rank, bool ok, const std::string& text) {
  pmoe::testing::leave("peer-loss", rank, ok, text);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc != 4) leave(rank, false, "usage: peer_loss STAMP_FILE VICTIM SEED");
  const std::string stamp_file = argv[1];
  const int victim = std::atoi(argv[2]);
  const unsigned seed = unsigned(std::atoi(argv[3]));

  // PMOE_TEST_DEVICE=cuda: the processes share the GPU (the emulated one under
  // PMOE_CUDA_EMULATE=1), and their kernels wait where the host cannot watch.
  const char* device_name = std::getenv("PMOE_TEST_DEVICE");
  const bool on_gpu = device_name && std::string(device_name) == "cuda";
  pmoe::MpiCommunicator comm(MPI_COMM_WORLD, on_gpu ? pmoe::Device::cuda(0) : pmoe::Device::cpu());
  pmoe::testing::MaskCase c;
  c.config = pmoe::testing::make_config(/*max_tokens=*/16, /*experts=*/4 * size, /*top_k=*/3,
                                        /*hidden=*/64);
  c.config.placement = pmoe::ExpertPlacement::round_robin(2 * size, 4 * size);
  c.config.on_peer_loss = pmoe::OnPeerLoss::mask;
  c.config.peer_timeout_s = 10;  // a backstop: the pid watch finds a killed peer in ~20 ms
  c.calls = 1 << 30;             // until 10 calls after the loss
  c.random_losses = true;
  c.calls_after_loss = 10;
  c.split_phases = seed % 2 == 1;
  c.seed = seed;

  // The victim dies 20..200 ms after the op is made, in whatever call and step it is in.
  c.on_ready = [&] {
    if (rank != victim) return;
    std::mt19937 random(seed);
    const int delay_ms = 20 + int(random() % 180);
    pmoe::testing::kill_self_after(delay_ms, stamp_file);
  };
  std::vector<pmoe::testing::LossReport> losses;
  std::string error;
  try {
    error = pmoe::testing::run_mask_case(comm, c, &losses);
  } catch (const std::exception& e) {
    error = std::string("threw: ") + e.what();
  }
  if (rank == victim) leave(rank, false, "the victim outlived its kill: " + error);
  if (!error.empty()) leave(rank, false, error);
  if (losses.size() != 1)
    leave(rank, false, std::to_string(losses.size()) + " PeerLost where one was due");
  const pmoe::testing::LossReport& loss = losses[0];
  if (loss.ranks != std::vector<int>{victim})
    leave(rank, false, "the PeerLost does not name the victim alone: " + loss.message);
  const int64_t killed = pmoe::testing::kill_stamp(stamp_file);
  if (killed == 0) leave(rank, false, "no kill stamp: " + loss.message);
  const double latency_ms = double(loss.noticed_ns - killed) / 1e6;
  leave(rank, true, pmoe::detail::cat(latency_ms, " first=", loss.first_call, " last=",
                                      loss.last_call, " next=", loss.next_call));
}
