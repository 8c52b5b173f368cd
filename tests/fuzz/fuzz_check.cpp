#include "fuzz_check.hpp"

#include <atomic>
#include <cstdio>
#include <string>
#include <cstdlib>
#include <exception>
#include <mutex>

#include "pmoe/error.hpp"

namespace pmoe::fuzz {

void fuzz_bug(const std::string& what) {
  std::fprintf(stderr, "pmoe fuzz: BUG: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

namespace {
std::atomic<long> checked{0}, refused{0};
}  // namespace

void count_outcome(bool was_refused) { (was_refused ? refused : checked).fetch_add(1); }

void init_fuzzing() {
  setenv("PMOE_TIMEOUT_S", "20", /*overwrite=*/0);
  const char* stats = std::getenv("PMOE_FUZZ_STATS");
  if (stats && std::string(stats) == "1")
    std::atexit([] {
      std::fprintf(stderr, "pmoe fuzz: %ld inputs ran to a checked result, %ld were refused\n",
                   checked.load(), refused.load());
    });
}

std::vector<RankOutcome> run_collective(int W, const std::function<void(Communicator&)>& fn) {
  std::vector<RankOutcome> outcomes(static_cast<size_t>(W));
  std::mutex mutex;
  try {
    run_ranks(W, [&](Communicator& comm) {
      try {
        fn(comm);
      } catch (const Error& e) {
        std::lock_guard lock(mutex);
        outcomes[size_t(comm.rank())] = {true, e.what()};
        throw;
      } catch (const std::exception& e) {
        fuzz_bug(std::string("rank threw something other than pmoe::Error: ") + e.what());
      }
    });
  } catch (const Error&) {
    // recorded per rank above
  }
  for (const RankOutcome& o : outcomes)
    if (o.threw && o.message.find("did not arrive within") != std::string::npos)
      fuzz_bug("a wait timed out (a hang): " + o.message);
  return outcomes;
}

bool all_threw(const std::vector<RankOutcome>& outcomes, const std::string& what) {
  int threw = 0;
  for (const RankOutcome& o : outcomes) threw += o.threw;
  if (threw != 0 && threw != int(outcomes.size())) {
    std::string detail;
    for (size_t r = 0; r < outcomes.size(); ++r)
      detail += "\n  rank " + std::to_string(r) + ": " +
                (outcomes[r].threw ? outcomes[r].message : std::string("returned"));
    fuzz_bug(what + ": " + std::to_string(threw) + " of " + std::to_string(outcomes.size()) +
             " ranks threw" + detail);
  }
  return threw != 0;
}

}  // namespace pmoe::fuzz
