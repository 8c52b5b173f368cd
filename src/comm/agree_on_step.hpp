// The set-up error exchange of the communicators (MPI and socket) and of the GPU remote path's
// set-up: each step of a collective set-up (create, map, IPC open, loading NCCL) ends with it, so
// that a failure on one rank becomes an error on every rank ("<step> failed on rank r: ...")
// instead of a wait that times out, or a collective call that a failed rank never joins.
#pragma once

#include <functional>
#include <string>

#include "pmoe/comm.hpp"

namespace pmoe::detail {

// Collective: gathers every rank's error text for `step` ("" = this rank succeeded) and throws
// pmoe::Error naming the lowest rank that failed, on every rank. The text is cut at 479 bytes.
void agree_on_step(Communicator& comm, const std::string& my_error, const std::string& step);

// Runs `run`; its exception's message ("(no message)" for an empty one), or "" if it returned.
std::string failure_of(const std::function<void()>& run);

// The same for a step given as code: runs `run` on this rank, and its exception's message (if it
// threw) is this rank's error text.
void agree_on_step(Communicator& comm, const std::function<void()>& run, const std::string& step);

}  // namespace pmoe::detail
