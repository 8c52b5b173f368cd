#include "comm/wait.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <ctime>
#include <string>

#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

using namespace std::chrono_literals;

enum class Choice { adaptive, spin, block };

Choice choice_from_env() {
  const char* text = std::getenv("PMOE_WAIT");
  const std::string name = text && *text ? text : "adaptive";
  if (name == "adaptive") return Choice::adaptive;
  if (name == "spin") return Choice::spin;
  if (name == "block") return Choice::block;
  throw Error(cat("PMOE_WAIT must be 'adaptive', 'spin' or 'block', got '", name, "'"));
}

std::atomic<bool> oversubscribed{false};

}  // namespace

WaitPolicy wait_policy() {
  static const Choice choice = choice_from_env();
  // Blocking: yield 50 us (a peer sharing the core runs; far less than a scheduler slice), then
  // block, first for 20 us and doubling up to kMaxBlock for waits nobody wakes.
  constexpr WaitPolicy kBlock{true, 50us, 20us};
  // The policy before blocking existed, kept where ranks have cores of their own.
  constexpr WaitPolicy kSpin{false, 5ms, 50us};
  switch (choice) {
    case Choice::spin: return kSpin;
    case Choice::block: return kBlock;
    case Choice::adaptive: break;
  }
  if (oversubscribed.load(std::memory_order_relaxed)) return kBlock;
  return {true, 5ms, 20us};  // kSpin's stages, then blocking instead of 50 us naps
}

void note_ranks_on_node(int ranks, int cpus) {
  if (ranks > cpus) oversubscribed.store(true, std::memory_order_relaxed);
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
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
