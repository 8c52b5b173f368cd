// ExpertPlacement and RankMask (pmoe/placement.hpp), and the slot table built from them.
#include "pmoe/placement.hpp"

#include <algorithm>
#include <numeric>

#include "all_to_all/slot_table.hpp"
#include "pmoe/error.hpp"

namespace pmoe {

ExpertPlacement ExpertPlacement::round_robin(int num_logical, int num_slots) {
  PMOE_CHECK(num_logical >= 1 && num_slots >= num_logical, "ExpertPlacement::round_robin: needs ",
             "1 <= num_logical (", num_logical, ") <= num_slots (", num_slots, ")");
  ExpertPlacement p;
  p.num_logical_experts = num_logical;
  p.slot_expert.resize(size_t(num_slots));
  for (int s = 0; s < num_slots; ++s) p.slot_expert[size_t(s)] = s % num_logical;
  return p;
}

void ExpertPlacement::validate(int num_slots) const {
  PMOE_CHECK(int64_t(slot_expert.size()) == num_slots, "ExpertPlacement: slot_expert has ",
             slot_expert.size(), " entries but the exchange has ", num_slots,
             " slots (num_experts); give every slot its logical expert");
  PMOE_CHECK(num_logical_experts >= 1 && num_logical_experts <= num_slots, "ExpertPlacement: ",
             "num_logical_experts must be in [1, ", num_slots, "] (the slots), got ",
             num_logical_experts);
  std::vector<int> slots_of(size_t(num_logical_experts), 0);
  for (size_t s = 0; s < slot_expert.size(); ++s) {
    const int32_t e = slot_expert[s];
    PMOE_CHECK(e >= 0 && e < num_logical_experts, "ExpertPlacement: slot ", s, " serves expert ",
               e, ", outside [0, ", num_logical_experts, ")");
    ++slots_of[size_t(e)];
  }
  for (int e = 0; e < num_logical_experts; ++e)
    PMOE_CHECK(slots_of[size_t(e)] > 0, "ExpertPlacement: logical expert ", e, " has no slot; ",
               "every expert needs at least one");
}

int RankMask::live_count() const {
  return int(std::count(live.begin(), live.end(), uint8_t(1)));
}

namespace detail {

SlotTable::SlotTable(const AllToAllConfig& config, int world_size)
    : logical_(config.placement.empty() ? config.num_experts
                                        : config.placement.num_logical_experts),
      slots_per_rank_(config.num_experts / world_size),
      placed_(!config.placement.empty()),
      renormalize_(config.masked_experts == MaskedExperts::renormalize) {
  slot_expert_.resize(size_t(config.num_experts));
  if (placed_)
    slot_expert_ = config.placement.slot_expert;
  else
    std::iota(slot_expert_.begin(), slot_expert_.end(), 0);
  set_live(std::vector<uint8_t>(size_t(world_size), 1));
}

void SlotTable::set_live(const std::vector<uint8_t>& live) {
  first_.assign(size_t(logical_) + 1, 0);
  slots_.clear();
  bool masked = false;
  for (uint8_t l : live) masked |= !l;
  rewrites_ = placed_ || masked;
  // Counting sort of the live slots by expert: ascending slots within each expert.
  auto is_live = [&](size_t s) { return live[s / size_t(slots_per_rank_)] != 0; };
  for (size_t s = 0; s < slot_expert_.size(); ++s)
    if (is_live(s)) ++first_[size_t(slot_expert_[s]) + 1];
  for (int e = 0; e < logical_; ++e) first_[size_t(e) + 1] += first_[size_t(e)];
  slots_.resize(size_t(first_.back()));
  std::vector<int32_t> next(first_.begin(), first_.end() - 1);
  for (size_t s = 0; s < slot_expert_.size(); ++s)
    if (is_live(s)) slots_[size_t(next[size_t(slot_expert_[s])]++)] = int32_t(s);
}

std::vector<int> SlotTable::lost_experts() const {
  std::vector<int> lost;
  for (int e = 0; e < logical_; ++e)
    if (first_[size_t(e)] == first_[size_t(e) + 1]) lost.push_back(e);
  return lost;
}

}  // namespace detail
}  // namespace pmoe
