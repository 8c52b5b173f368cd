// Logical experts to live slots: the rule every backend applies to a token's top-k row before
// the exchange sees it, on the host (the CPU backend) or in a kernel (a GPU's, reading the table
// from device memory, so that a captured graph follows a later mask). Dispatch and combine apply
// it to the same row and get the same slots, so combine reads the rows dispatch sent.
//
// The table lists, for each logical expert, its slots on live ranks in ascending order. Token t
// of rank r takes live slot (r + t) mod n of its expert: deterministic, and it spreads a hot
// expert's tokens over its replicas. An expert with no live slot is dropped (-1, which the
// exchange skips); with MaskedExperts::renormalize, a token that lost one has the weights of the
// slots it kept divided by their sum, added in slot order in f32 (the others keep theirs).
#pragma once

#include <climits>
#include <cstdint>

#include "all_to_all/host_device.hpp"

namespace pmoe::detail {

struct SlotTableView {
  const int32_t* first;  // [logical + 1]: expert e's live slots are slots[first[e], first[e+1])
  const int32_t* slots;
  int logical;           // logical experts: a valid index lies in [0, logical)
  bool renormalize;
};

// The slot of index `e` for token `token` of rank `rank`: -1 for -1 or an expert with no live
// slot; INT32_MIN for an index outside [-1, logical), which the exchange's range check reports.
PMOE_HOST_DEVICE inline int32_t live_slot(const SlotTableView& table, int64_t e, int rank,
                                          int64_t token) {
  if (e == -1) return -1;
  if (e < -1 || e >= table.logical) return INT32_MIN;
  const int32_t begin = table.first[e], n = table.first[e + 1] - begin;
  if (n == 0) return -1;
  return table.slots[begin + int32_t((int64_t(rank) + token) % n)];
}

// A token's row of k indices (Index: int32_t or int64_t) to slots, and, with weights, its weights
// as combine must use them. `weights_out` may be null (dispatch).
template <typename Index>
PMOE_HOST_DEVICE inline void route_row(const SlotTableView& table, const Index* indices, int k,
                                       int rank, int64_t token, int32_t* slots_out,
                                       const float* weights, float* weights_out) {
  float kept = 0.0f;
  bool lost = false;  // an expert of the row has no live slot
  for (int j = 0; j < k; ++j) {
    slots_out[j] = live_slot(table, int64_t(indices[j]), rank, token);
    lost |= indices[j] >= 0 && slots_out[j] == -1;
    if (weights && slots_out[j] >= 0) kept += weights[j];
  }
  if (!weights_out) return;
  const bool scale = table.renormalize && lost && kept > 0.0f;
  for (int j = 0; j < k; ++j) weights_out[j] = scale ? weights[j] / kept : weights[j];
}

}  // namespace pmoe::detail
