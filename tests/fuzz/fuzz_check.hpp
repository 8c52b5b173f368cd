// How a fuzz target judges a run. A wrong result, an exception that is not pmoe::Error, a wait
// that ran into its timeout (a hang: every wait here should end by a result or a peer's error),
// or a rank that ended differently from its peers when it should not: fuzz_bug() prints it and
// aborts, which libFuzzer (and the replay driver) report as a crash with the input saved.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "pmoe/comm.hpp"

namespace pmoe::fuzz {

[[noreturn]] void fuzz_bug(const std::string& what);

// What one rank's part of a collective run ended with.
struct RankOutcome {
  bool threw = false;   // a pmoe::Error
  std::string message;  // its text
};

// Runs fn on W thread ranks; each rank's pmoe::Error is recorded and passed on to run_ranks (so
// that its peers stop waiting). Any other exception, and any timeout, is a bug.
std::vector<RankOutcome> run_collective(int W, const std::function<void(Communicator&)>& fn);

// True if every rank threw; a bug if some did and others did not (when `all_or_none`).
bool all_threw(const std::vector<RankOutcome>& outcomes, const std::string& what);

// Sets the wait timeout low (PMOE_TIMEOUT_S=20 unless set): a hang shows in seconds. With
// PMOE_FUZZ_STATS=1 in the environment, prints at exit how many inputs ran to a checked result
// and how many were refused (so that one can see a target is not refusing nearly everything).
void init_fuzzing();
void count_outcome(bool refused);

}  // namespace pmoe::fuzz
