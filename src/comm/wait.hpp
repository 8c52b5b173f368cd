// The one bounded wait of pmoe. Ranks may outnumber cores (8 thread ranks on 2 cores in tests),
// so a wait spins only briefly, then yields, then sleeps in short naps; it never blocks in the
// kernel with no deadline.
#pragma once

#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PMOE_CPU_RELAX() _mm_pause()
#else
#define PMOE_CPU_RELAX() ((void)0)
#endif

namespace pmoe::detail {

// Polls ready() until it returns true. Between polls it calls poll_side() (group failure checks,
// MPI progress; it may throw) now and then, and calls on_timeout() (which must throw) once
// `timeout_s` has passed.
template <typename Ready, typename PollSide, typename OnTimeout>
void wait_until(double timeout_s, Ready&& ready, PollSide&& poll_side, OnTimeout&& on_timeout) {
  if (ready()) return;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  for (int spin = 0; spin < 256; ++spin) {
    PMOE_CPU_RELAX();
    if (ready()) return;
  }
  for (uint64_t round = 0;; ++round) {
    poll_side();
    if (ready()) return;
    const auto now = Clock::now();
    if (now >= deadline) {
      on_timeout();
      return;
    }
    // Yield for the first few milliseconds (a yield returns at once when a core is free, so
    // latency stays low), then nap: a long wait must not burn a core its peer needs.
    if (now - start < std::chrono::milliseconds(5)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace pmoe::detail
