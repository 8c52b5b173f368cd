// Memory accounting (pmoe/memory.hpp): every Buffer is counted on the thread that allocates it,
// freed bytes come off, peaks reset, and threads do not see each other's counts.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>

#include "pmoe/memory.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe {
namespace {

TEST(Memory, BuffersAreCountedAndUncounted) {
  const MemoryUsage before = thread_memory();
  {
    Buffer a(DType::f32, {100});  // 400 bytes, rounded up to 448
    EXPECT_EQ(thread_memory().current_bytes - before.current_bytes, 448);
    Buffer b(DType::bf16, {3, 64});  // 384 bytes
    EXPECT_EQ(thread_memory().current_bytes - before.current_bytes, 448 + 384);
  }
  EXPECT_EQ(thread_memory().current_bytes, before.current_bytes);
  // A zero-size buffer still owns a 64-byte block, and gives it back.
  {
    Buffer empty(DType::f32, {0});
    EXPECT_EQ(thread_memory().current_bytes - before.current_bytes, 64);
  }
  EXPECT_EQ(thread_memory().current_bytes, before.current_bytes);
}

TEST(Memory, PeakHoldsUntilReset) {
  reset_thread_peak();
  const int64_t base = thread_memory().current_bytes;
  { Buffer big(DType::f32, {1 << 16}); }
  EXPECT_EQ(thread_memory().peak_bytes - base, 4 << 16);
  EXPECT_EQ(thread_memory().current_bytes, base);
  reset_thread_peak();
  EXPECT_EQ(thread_memory().peak_bytes, base);
}

TEST(Memory, ThreadsCountSeparately) {
  const int64_t mine = thread_memory().current_bytes;
  int64_t theirs = -1;
  Buffer held;
  std::thread other([&] {
    const int64_t start = thread_memory().current_bytes;
    held = Buffer(DType::f32, {1024});
    theirs = thread_memory().current_bytes - start;
  });
  other.join();
  EXPECT_EQ(theirs, 4096);
  EXPECT_EQ(thread_memory().current_bytes, mine);  // not counted here
}

TEST(Memory, AlignedFreeOfNullIsANoOp) {
  const int64_t before = thread_memory().current_bytes;
  aligned_free(nullptr);
  EXPECT_EQ(thread_memory().current_bytes, before);
}

// The current resident set (VmRSS), to compare the peak with.
int64_t current_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

TEST(Memory, PeakRssIsReadableAndResets) {
  const int64_t rss = peak_rss_bytes();
  ASSERT_GT(rss, 0);
  // Touching 64 MiB raises the peak by about that much.
  {
    Buffer touched(DType::f32, {16 << 20});
    EXPECT_GE(peak_rss_bytes(), rss + (48 << 20));
  }
  // After a reset the peak is the current resident set (which the freed buffer may or may not
  // still be part of: allocators, and the sanitizers' quarantine, keep some freed memory).
  if (reset_peak_rss()) {
    const int64_t peak = peak_rss_bytes(), now = current_rss_bytes();
    EXPECT_LE(peak, now + (4 << 20));
  }
}

}  // namespace
}  // namespace pmoe
