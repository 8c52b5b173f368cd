// Which expert each local expert slot of a layer's rank computes: under an EpMoe placement, the
// logical expert of each of the rank's slots (replicas repeat one); otherwise a range.
#pragma once

#include <vector>

#include "pmoe/moe.hpp"

namespace pmoe::detail {

// The exchange's experts: the placement's slots, or the layer's experts.
inline int slot_count(const MoeConfig& config, const ExpertPlacement& placement) {
  return placement.empty() ? config.num_experts : int(placement.slot_expert.size());
}

// Rank `rank` of `world`: its slots [rank S / W, (rank + 1) S / W), each as the expert it serves.
inline std::vector<int> rank_experts(const MoeConfig& config, const ExpertPlacement& placement,
                                     int rank, int world) {
  const int per_rank = slot_count(config, placement) / world;
  std::vector<int> experts;
  for (int s = rank * per_rank; s < (rank + 1) * per_rank; ++s)
    experts.push_back(placement.empty() ? s : placement.slot_expert[size_t(s)]);
  return experts;
}

// Every expert of the layer, in order (SimpleMoe, TpMoe).
inline std::vector<int> all_experts(const MoeConfig& config) {
  return rank_experts(config, ExpertPlacement{}, 0, 1);
}

}  // namespace pmoe::detail
