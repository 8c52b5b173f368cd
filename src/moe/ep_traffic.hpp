// What EpMoe reports as its traffic (MoeStats::bytes_moved), one rule for both backends: the CPU
// layer sums it over its routing on the host (src/cpu/ep_moe.cpp), the device layer in a kernel
// over the routing it keeps on the device (src/cuda/moe/ep_moe.cu), so the two report the same
// figure.
#pragma once

#include <cstdint>

#include "all_to_all/host_device.hpp"
#include "all_to_all/route.hpp"

namespace pmoe::detail {

// Rows of the wire width that one token moves between ranks: the token once to each other rank
// owning one of its experts (first_in_group: AllToAll's rule of which slots send), and one row
// back per slot whose expert lives on another rank. `experts`: the token's top-k row.
PMOE_HOST_DEVICE inline int ep_token_rows_moved(const int32_t* experts, int k, int num_experts,
                                                int num_local, int rank) {
  int rows = 0;
  for (int j = 0; j < k; ++j) {
    if (experts[j] / num_local == rank) continue;
    rows += 1 + (first_in_group(experts, j, num_experts, num_local) ? 1 : 0);
  }
  return rows;
}

}  // namespace pmoe::detail
