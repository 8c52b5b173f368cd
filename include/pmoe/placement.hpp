// Where experts live, what becomes of a token's slot when the ranks that hold its expert are
// masked, and what an op does when it loses a peer. An AllToAll (and the MoE layers over it)
// takes them in its config.
//
// Without a placement, the router's indices name experts directly: expert e lives on rank
// e / E_local. With one, they name logical experts, each served by one or more physical slots
// (the exchange's num_experts, E_local of them a rank), as DeepSeek's EPLB deploys redundant
// experts: a slot computes the same function as every other slot of its logical expert, so
// which one a token reaches changes no bit of the result.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pmoe {

struct ExpertPlacement {
  // slot_expert[s]: the logical expert that physical slot s serves, in [0, num_logical_experts).
  // Slot s lives on rank s / E_local. Empty: no placement (indices name slots).
  std::vector<int32_t> slot_expert;
  int num_logical_experts = 0;

  bool empty() const { return slot_expert.empty(); }
  // Slot s serves logical expert s % num_logical: with num_slots = 2 * num_logical every expert
  // has two replicas, on ranks E_local * W / 2 apart (a whole half of the group apart when W is
  // even), so that losing one rank loses no expert.
  static ExpertPlacement round_robin(int num_logical, int num_slots);
  // Throws pmoe::Error saying what to change unless it places num_logical_experts experts on
  // exactly `num_slots` slots, each expert on at least one.
  void validate(int num_slots) const;
};

// A token's slot whose expert has no live slot (every rank holding it is masked).
enum class MaskedExperts : uint8_t {
  drop,         // the slot adds nothing; the token's other weights stay as they are (as
                // DeepEP's, NCCL EP's and Mooncake EP's masks do)
  renormalize,  // the slot adds nothing; the token's remaining weights are divided by their sum
                // (f32, in slot order), so that they add up to 1 again
};

// What a call does when a peer is lost (AllToAllConfig::on_peer_loss, EpMoeOptions::on_peer_loss).
//   fail: it throws pmoe::Error naming the peer, on every rank that waits for it, and the op is
//         retired (the default).
//   mask: the survivors mask the lost rank and go on (docs/robustness.md). A peer is lost when
//         its process ends (node-local peers, seen within about 20 ms) or when a wait for it lasts
//         peer_timeout_s. The survivors agree on the mask and on the first call that cannot
//         stand; each throws pmoe::PeerLost for its calls from there, and its next call runs
//         without the lost ranks.
enum class OnPeerLoss : uint8_t { fail, mask };

// The live ranks of a group, and why each masked one is masked.
struct RankMask {
  std::vector<uint8_t> live;         // [W]: 1 live, 0 masked
  std::vector<std::string> reasons;  // [W]: "" for a live rank
  int live_count() const;
};

}  // namespace pmoe
