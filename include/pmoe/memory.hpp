// Memory accounting: how many bytes the library holds through aligned_alloc_zeroed (every Buffer,
// the thread ranks' symmetric regions, the MoE layers' weights and workspaces), counted per
// thread, and the process's peak resident set. pmoe-bench reports both per rank.
//
// A thread rank is a thread, so "this thread" is "this rank"; an MPI rank is its process's main
// thread. Counters are thread_local: counting costs two adds per allocation and no lock. A block
// freed by another thread than the one that allocated it is subtracted from the freeing thread
// (the thread ranks' symmetric regions are freed by whichever rank drops them last), so measure
// differences over a span of work: reset_thread_peak(), do the work, then
// thread_memory().peak_bytes minus the current_bytes seen at the reset.
#pragma once

#include <cstdint>

namespace pmoe {

struct MemoryUsage {
  int64_t current_bytes = 0;  // allocated minus freed by this thread, since it started
  int64_t peak_bytes = 0;     // the most current_bytes has been since the last reset
};

// This thread's counters.
MemoryUsage thread_memory();
// Sets this thread's peak to its current bytes, so the next peak covers only what follows.
void reset_thread_peak();

// The process's peak resident set size in bytes (VmHWM), or -1 where the OS does not say.
int64_t peak_rss_bytes();
// Resets the process's peak resident set to the current one (Linux: /proc/self/clear_refs);
// returns false where that is not possible, and then peak_rss_bytes() keeps the older peak.
bool reset_peak_rss();

}  // namespace pmoe
