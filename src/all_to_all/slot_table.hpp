// The host's copy of the table that src/all_to_all/slot_routing.hpp reads: each logical expert's
// slots on live ranks, rebuilt when the mask changes.
#pragma once

#include <cstdint>
#include <vector>

#include "all_to_all/slot_routing.hpp"
#include "pmoe/all_to_all.hpp"

namespace pmoe::detail {

class SlotTable {
 public:
  // For `config` on `world_size` ranks with every rank live.
  SlotTable(const AllToAllConfig& config, int world_size);
  // From the next call on, slots on ranks with live[r] == 0 take no token.
  void set_live(const std::vector<uint8_t>& live);

  // True when indices are not slots as they stand: a placement, or a masked rank.
  bool rewrites() const { return rewrites_; }
  int logical_experts() const { return logical_; }
  SlotTableView view() const { return {first_.data(), slots_.data(), logical_, renormalize_}; }
  // Logical experts left with no live slot, ascending.
  std::vector<int> lost_experts() const;
  const std::vector<int32_t>& first() const { return first_; }
  const std::vector<int32_t>& slots() const { return slots_; }

 private:
  std::vector<int32_t> slot_expert_;  // slot -> logical expert (the identity without placement)
  std::vector<int32_t> first_, slots_;
  int logical_, slots_per_rank_;
  bool placed_, renormalize_, rewrites_ = false;
};

}  // namespace pmoe::detail
