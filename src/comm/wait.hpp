// The one bounded wait of pmoe. Ranks may outnumber cores (4 MPI ranks or 8 thread ranks on 2
// cores in tests, a laptop, a CI runner), so a wait goes through three stages:
//   1. spin a few microseconds: a peer that is running answers that fast, and a spin costs
//      nothing when every rank has its own core;
//   2. yield: a peer that shares this core gets it at once;
//   3. block: in the kernel on the awaited word (futex) where the waker knows to wake it (up to
//      kMaxBlock at a time), else in naps growing to kMaxNap. The core goes idle, so the
//      scheduler moves a runnable peer onto it. Waiters that kept yielding on a core that the
//      ranks they waited for needed made 4 ranks on 2 cores take milliseconds per call.
// How long stage 2 lasts depends on whether this process's ranks outnumber the cores they may
// run on (the communicators report it at set-up, note_ranks_on_node): if they do, 50 us, and
// then block; if not, 5 ms as before blocking existed, since a rank with a core of its own loses
// nothing by yielding and a woken sleeper would add its wake-up latency to every wait.
// Every stage polls the side conditions (a failed or dead peer, MPI progress) and the deadline;
// no block lasts longer than kMaxBlock, so the latency of those checks stays bounded.
//
// PMOE_WAIT overrides the choice: "spin" (yield 5 ms, then 50 us naps, never a futex: the policy
// before this one), "block" (always the oversubscribed policy) or "adaptive" (the default), so
// that one binary can measure them side by side.
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
  bool block;                          // stage 3 blocks (futex, or naps up to kMaxNap)
  std::chrono::nanoseconds yield_for;  // length of stage 2
  std::chrono::nanoseconds nap;        // first nap of stage 3 (fixed in the "spin" policy)
};
// The policy now: PMOE_WAIT (read once; an unknown value throws), else adaptive.
WaitPolicy wait_policy();
// A communicator saw `ranks` of its ranks in this process's node share `cpus` CPUs. Once any
// group of this process is oversubscribed, adaptive waits block early for the process's life.
void note_ranks_on_node(int ranks, int cpus);
// The CPUs this thread may run on (its affinity mask), at least 1.
int usable_cpus();

inline constexpr int kSpins = 256;  // a few microseconds of _mm_pause
inline constexpr auto kMaxBlock = std::chrono::milliseconds(1);  // a futex wait (woken early)
inline constexpr auto kMaxNap = std::chrono::microseconds(100);   // a nap nobody cuts short

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
  const WaitPolicy policy = wait_policy();
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

// The same, blocking in plain naps of at most kMaxNap, since nothing wakes them: for MPI
// requests, barriers and waits on signals outside SymmetricMemory::wait_signal.
template <typename Ready, typename PollSide, typename OnTimeout>
void wait_until(double timeout_s, Ready&& ready, PollSide&& poll_side, OnTimeout&& on_timeout) {
  wait_until(timeout_s, ready, poll_side, on_timeout, [](std::chrono::nanoseconds nap) {
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(nap, kMaxNap));
  });
}

}  // namespace pmoe::detail
