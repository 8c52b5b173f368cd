// The set-up error exchange of the communicators (MPI and socket): each step of a collective
// set-up (create, map, IPC open) ends with it, so that a failure on one rank becomes an error on
// every rank ("<step> failed on rank r: ...") instead of a wait that times out.
#pragma once

#include <string>

#include "pmoe/comm.hpp"

namespace pmoe::detail {

// Collective: gathers every rank's error text for `step` ("" = this rank succeeded) and throws
// pmoe::Error naming the first rank that failed, on every rank. The text is cut at 199 bytes.
void agree_on_step(Communicator& comm, const std::string& my_error, const std::string& step);

}  // namespace pmoe::detail
