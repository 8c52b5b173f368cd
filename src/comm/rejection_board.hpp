// What a rank tells its peers when it rejects its own call. A call one rank rejects never reaches
// its peers, which then wait for it; when such a wait times out, the waiting rank reads the
// peer's slot here and names the peer's reason instead of only "did not arrive".
//
// One slot per rank, written only by its rank: on thread ranks in the process's memory, across
// MPI processes in node-shared memory (peers on other nodes have no slot: their reason stays with
// them). A slot holds the rejection until the rank's next call passes its checks. Writes and
// reads follow a sequence lock, so a reader never takes a half-written text for a whole one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace pmoe::detail {

struct RejectionSlot {
  uint64_t sequence;  // odd while being written; 0: never written
  char text[504];     // NUL-terminated, cut to fit
};
static_assert(sizeof(RejectionSlot) == 512);

// Writes `text` ("" clears the slot).
void write_rejection(RejectionSlot& slot, const std::string& text);
// The slot's text, or "" when it holds none or is being written.
std::string read_rejection(const RejectionSlot& slot);

}  // namespace pmoe::detail
