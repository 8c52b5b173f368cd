// Packed expert rows of exactly the size that arrives, as a case shared by the thread and MPI
// tests: dispatch(send), arriving_rows(), an [n, H] expert_x, dispatch(recv), then combine from
// an [n, H] expert_y, each call checked against the plain reference.
#pragma once

#include <functional>
#include <string>

#include "pmoe/all_to_all.hpp"

namespace pmoe::testing {

// Runs `calls` rounds on `comm` (collective; cfg.packed_expert_rows set, an input dtype without
// scales) on one AllToAll; some ranks send no token in some rounds.
// too_small: each round first offers dispatch(recv) and combine one row too few, which must be
// refused by name before anything moves, then the right sizes. Returns "" or what differed.
std::string run_exact_packed_rounds(Communicator& comm, const AllToAllConfig& cfg, int calls,
                                    bool too_small);

// The message of the pmoe::Error `call` throws, or "" if it throws none.
std::string error_of(const std::function<void()>& call);

}  // namespace pmoe::testing
