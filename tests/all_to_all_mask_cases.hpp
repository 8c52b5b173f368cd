// AllToAll with an expert placement and masked ranks: ranks stop calling part-way, the others
// mask them and go on, and every call of every live rank is checked against the plain
// reference with the mask that call used. Shared by the CPU and the emulated-device tests.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "pmoe/all_to_all.hpp"
#include "pmoe/comm.hpp"

namespace pmoe::testing {

struct MaskCase {
  AllToAllConfig config;  // rank_mask set where ranks stop; placement and masked_experts as tested
  int calls = 5;
  // (rank, call): the rank makes no call from that call on, and the others mask it before it.
  std::vector<std::pair<int, int>> stops;
  bool split_phases = false;
  // On a device: dispatch and combine captured once into CUDA graphs (with bound_m) before any
  // rank stops, and replayed each call; the mask reaches them through device memory.
  bool graph = false;
  uint64_t seed = 7;

  // on_peer_loss = mask: nobody masks a stopped rank; the others find it lost (peer timeout)
  // and each expects a pmoe::PeerLost that names it, for the calls the rule below gives, and
  // goes on. Calls are keyed by AllToAll::calls_started(), which the survivors agree on.
  bool automatic = false;
  // Where a rank stops in its last call: before it; after its dispatch(send) (the others'
  // combine waits for it: that call is lost); after its combine(send) (split phases: the others
  // finish that call and lose the next).
  enum class StopPoint { before_call, after_dispatch_send, after_combine_send };
  StopPoint stop_point = StopPoint::before_call;
  // The stopped rank comes back once the others went on (after 3 peer timeouts): its next call
  // must fail with a pmoe::Error (not a PeerLost) and write nothing.
  bool stopped_rank_returns = false;
  // (rank, call): a rank that stopped (before_call) comes back: the others unmask it before that
  // call, and it calls rejoin() and goes on from the call the others make next.
  std::vector<std::pair<int, int>> rejoins;
  // Ranks are lost at moments the test does not choose (a process killed at random): any
  // PeerLost is taken as it comes, told to `losses`, and the run ends `calls_after_loss` calls
  // after the last one, without a final barrier (the dead take no part in one).
  bool random_losses = false;
  int calls_after_loss = 10;
  // Called once the op and its buffers are made, before the first call.
  std::function<void()> on_ready;
};

// One PeerLost as a survivor saw it (random_losses).
struct LossReport {
  std::vector<int> ranks;
  int64_t first_call = 0, last_call = 0, next_call = 0;
  int64_t noticed_ns = 0;  // steady clock
  std::string message;
};

// `c` with on_peer_loss = mask in automatic mode: nobody masks a rank that stops, the others find
// it lost after `peer_timeout_s`; `calls` calls.
MaskCase lost_rank_case(MaskCase c, double peer_timeout_s, int calls);

// Runs `c` on this rank (collective over the ranks still calling). "" when every call of this
// rank matched: the rows each local slot received (counts), and y, against the reference in
// which a token's expert goes to its live slot (r + t) mod n, and an expert with no live slot
// adds nothing (renormalize: the token's other weights divided by their sum). In automatic
// mode, also that every PeerLost named the stopped ranks and the expected calls, and came
// within the peer timeout (plus a second) of the stop.
std::string run_mask_case(Communicator& comm, const MaskCase& c,
                          std::vector<LossReport>* losses = nullptr);

// Runs `c` on W thread ranks of `device` (run_ranks) and expects every rank's "".
void expect_mask_case(int W, const MaskCase& c, Device device = Device::cpu());

}  // namespace pmoe::testing
