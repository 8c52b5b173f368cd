#include "comm/wait.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <ctime>
#include <string>

#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

WaitPolicy policy_from_env() {
  using namespace std::chrono_literals;
  const char* text = std::getenv("PMOE_WAIT");
  const std::string name = text && *text ? text : "adaptive";
  // adaptive: yield for 50 us (a peer sharing the core runs; far less than a scheduler slice),
  // then block, first for 20 us and doubling up to kMaxBlock for waits nobody wakes.
  if (name == "adaptive") return {true, 50us, 20us};
  if (name == "spin") return {false, 5ms, 50us};  // the policy before the futex stage
  throw Error(cat("PMOE_WAIT must be 'adaptive' or 'spin', got '", name, "'"));
}

}  // namespace

const WaitPolicy& wait_policy() {
  static const WaitPolicy policy = policy_from_env();
  return policy;
}

// Not FUTEX_PRIVATE_FLAG: the word may live in memory shared by several processes.
void futex_wait(const uint32_t* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  const auto ns = timeout.count();
  const timespec relative{time_t(ns / 1000000000), long(ns % 1000000000)};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &relative, nullptr, 0);
}

void futex_wake_all(const uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace pmoe::detail
