// The bytes an AllToAll must read and write per rank, the numerator of the roofline fraction
// (all_to_all_bench.cpp states the formula).
#pragma once

#include <vector>

#include "pmoe/all_to_all.hpp"
#include "reference/workload.hpp"

namespace pmoe::bench {

struct AllToAllBytes {
  double dispatch = 0;  // (tokens arriving + rows landed) x (payload + scale bytes)
  double combine = 0;   // rows summed x expert_y row bytes (bf16) + tokens x y row bytes (bf16)
};

// Collective: the mean over ranks. `all` holds every rank's inputs; `counts` is this rank's
// expert_num_tokens from dispatch, in CPU memory.
AllToAllBytes required_bytes(Communicator& comm, const AllToAllConfig& config,
                             const std::vector<reference::AllToAllInputs>& all,
                             const Tensor& counts);

}  // namespace pmoe::bench
