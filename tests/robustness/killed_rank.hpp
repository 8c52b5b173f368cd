// What the tests that kill an MPI process share: a clock that every process of the node reads
// alike, the verdict line each process prints before it leaves (survivors cannot finalize MPI
// with a dead peer), and the victim's own kill, stamped in a file so that the survivors can time
// how long they took to notice.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

namespace pmoe::testing {

inline int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Prints "<tag>: rank R ok|FAIL <text>" and leaves with _exit().
[[noreturn]] inline void leave(const char* tag, int rank, bool ok, const std::string& text) {
  std::printf("%s: rank %d %s %s\n", tag, rank, ok ? "ok" : "FAIL", text.c_str());
  std::fflush(stdout);
  _exit(ok ? 0 : 1);
}

// In `delay_ms`, this process writes monotonic_ns() to `stamp_file` and SIGKILLs itself, in
// whatever it is doing then.
inline void kill_self_after(int delay_ms, const std::string& stamp_file) {
  std::thread([delay_ms, stamp_file] {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    std::ofstream(stamp_file) << monotonic_ns() << "\n";
    raise(SIGKILL);
  }).detach();
}

// The kill's stamp (monotonic_ns), or 0 if none was written.
inline int64_t kill_stamp(const std::string& stamp_file) {
  int64_t killed = 0;
  std::ifstream(stamp_file) >> killed;
  return killed;
}

}  // namespace pmoe::testing
