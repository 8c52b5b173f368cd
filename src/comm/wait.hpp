// The one bounded wait of pmoe. Ranks may outnumber cores (4 MPI ranks or 8 thread ranks on 2
// cores in tests, a laptop, a CI runner), so a wait goes through three stages:
//   1. spin a few microseconds: a peer that is running answers that fast, and a spin costs
//      nothing when every rank has its own core;
//   2. yield for a short while: a peer that shares this core gets it at once;
//   3. block: in the kernel on the awaited word (futex) where the waker knows to wake it, else in
//      short naps. The core goes idle, so the scheduler moves a runnable peer onto it; a peer
//      that waits on a core another rank needs is what made 4 ranks on 2 cores take milliseconds
//      per call while a plain yield loop ran.
// Every stage polls the side conditions (a failed or dead peer, MPI progress) and the deadline;
// no block lasts longer than kMaxBlock, so the latency of those checks stays bounded.
//
// PMOE_WAIT=spin selects the previous policy (spin, yield for 5 ms, then 50 us naps, no futex),
// kept so that both can be measured side by side by one binary.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PMOE_CPU_RELAX() _mm_pause()
#else
#define PMOE_CPU_RELAX() ((void)0)
#endif

namespace pmoe::detail {

struct WaitPolicy {
  bool block;                          // stage 3 blocks (futex or naps growing to kMaxBlock)
  std::chrono::nanoseconds yield_for;  // length of stage 2
  std::chrono::nanoseconds nap;        // first nap of stage 3 (fixed in the "spin" policy)
};
// Read once from PMOE_WAIT ("adaptive", the default, or "spin"); an unknown value throws.
const WaitPolicy& wait_policy();

inline constexpr int kSpins = 256;  // a few microseconds of _mm_pause
inline constexpr auto kMaxBlock = std::chrono::milliseconds(1);

// Blocks until *word != expected, a wake on `word`, or `timeout`, whichever comes first (spurious
// returns are fine: callers loop). `word` may be shared between processes.
void futex_wait(const uint32_t* word, uint32_t expected, std::chrono::nanoseconds timeout);
// Wakes every thread blocked in futex_wait on `word`, in this or any process mapping it.
void futex_wake_all(const uint32_t* word);

// Polls ready() until it returns true. Between polls it calls poll_side() (group failure checks,
// MPI progress; it may throw) now and then, and calls on_timeout() (which must throw) once
// `timeout_s` has passed. In stage 3 it calls block(max), which must return within `max` (a
// nanoseconds duration) and may return early, when woken.
template <typename Ready, typename PollSide, typename OnTimeout, typename Block>
void wait_until(double timeout_s, Ready&& ready, PollSide&& poll_side, OnTimeout&& on_timeout,
                Block&& block) {
  if (ready()) return;
  using Clock = std::chrono::steady_clock;
  const WaitPolicy& policy = wait_policy();
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  for (int spin = 0; spin < kSpins; ++spin) {
    PMOE_CPU_RELAX();
    if (ready()) return;
  }
  std::chrono::nanoseconds nap = policy.nap;
  for (;;) {
    poll_side();
    if (ready()) return;
    const auto now = Clock::now();
    if (now >= deadline) {
      on_timeout();
      return;
    }
    if (now - start < policy.yield_for) {
      std::this_thread::yield();
    } else if (!policy.block) {
      std::this_thread::sleep_for(nap);
    } else {
      block(std::min<std::chrono::nanoseconds>(nap, deadline - now));  // never past the deadline
      nap = std::min<std::chrono::nanoseconds>(nap * 2, kMaxBlock);
    }
  }
}

// The same, blocking in plain naps: for waits nobody wakes (MPI requests, barriers).
template <typename Ready, typename PollSide, typename OnTimeout>
void wait_until(double timeout_s, Ready&& ready, PollSide&& poll_side, OnTimeout&& on_timeout) {
  wait_until(timeout_s, ready, poll_side, on_timeout,
             [](std::chrono::nanoseconds nap) { std::this_thread::sleep_for(nap); });
}

}  // namespace pmoe::detail
