// What every AllToAll backend agrees on about routing: which top-k slots of a token's row are
// sent (the rule dispatch and combine must share, or combine reads a row nobody sent), and the
// record of one received row that combine sends back.
#pragma once

#include <cstdint>

#include "all_to_all/host_device.hpp"

namespace pmoe::detail {

// True when slot j of a token's top-k row names an expert in [0, E) that no earlier slot names,
// counting experts in groups of `group`: with 1, the slot routes the token to that expert (-1,
// an index out of range and a repeat are not sent); with the experts per rank, it is the first
// slot that sends the token to that rank. Index: int32_t (the kernels), int64_t (host checks).
template <typename Index>
PMOE_HOST_DEVICE inline bool first_in_group(const Index* row, int j, int E, int group) {
  const Index e = row[j];
  if (e < 0 || e >= E) return false;
  for (int i = 0; i < j; ++i)
    if (row[i] >= 0 && row[i] / group == e / group) return false;
  return true;
}

// One (token, local expert) row received by this rank: where it came from and where it lies.
struct Route {
  int32_t source;    // rank the token came from
  int32_t token;     // its index at the source
  int32_t slot;      // top-k slot j at the source
  int32_t row;       // flat row e * rows_per_expert + position, in expert_x / expert_y
  int32_t src_slot;  // its token slot in this rank's dispatch block of `source`
};

}  // namespace pmoe::detail
