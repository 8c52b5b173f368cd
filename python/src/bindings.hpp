// One function per concept adds its classes and functions to the module.
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

#include "pmoe/placement.hpp"

namespace pmoe::python {

// A RankMask's live ranks as Python booleans (AllToAll's and EpMoe's live_ranks).
inline std::vector<bool> live_flags(const RankMask& mask) {
  return std::vector<bool>(mask.live.begin(), mask.live.end());
}

void bind_comm(nanobind::module_& m);
void bind_buffers(nanobind::module_& m);
void bind_all_to_all(nanobind::module_& m);
void bind_moe(nanobind::module_& m);
void bind_overlap(nanobind::module_& m);
void bind_socket(nanobind::module_& m);

}  // namespace pmoe::python
