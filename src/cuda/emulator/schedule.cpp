// The emulated device's schedules (schedule.hpp).
#include "cuda/emulator/schedule.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>

#include "cuda/emulator/late_stores.hpp"

namespace pmoe::emu {
namespace {

Schedule parse(const char* text) {
  Schedule s;
  if (!text || !*text || std::strcmp(text, "standard") == 0) return s;
  if (std::strcmp(text, "reverse") == 0) {
    s.kind = Schedule::Kind::reverse;
  } else if (std::strcmp(text, "thread0-last") == 0) {
    s.kind = Schedule::Kind::thread0_last;
  } else if (std::strncmp(text, "random:", 7) == 0 && text[7] != '\0') {
    char* end = nullptr;
    s.seed = std::strtoull(text + 7, &end, 10);
    s.kind = Schedule::Kind::random;
    s.valid = *end == '\0';
  } else {
    s.valid = false;
  }
  if (!s.valid)
    fprintf(stderr,
            "pmoe emulated device: PMOE_EMU_SCHEDULE=%s names no schedule (standard, "
            "random:SEED, reverse or thread0-last); every launch fails\n",
            text);
  return s;
}

// splitmix64: independent-looking seeds from consecutive numbers.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

const Schedule& schedule() {
  static const Schedule s = parse(std::getenv("PMOE_EMU_SCHEDULE"));
  return s;
}

std::string describe_device_settings() {
  const Schedule& s = schedule();
  std::string text = "PMOE_EMU_SCHEDULE=";
  switch (s.kind) {
    case Schedule::Kind::standard: text += "standard"; break;
    case Schedule::Kind::random: text += "random:" + std::to_string(s.seed); break;
    case Schedule::Kind::reverse: text += "reverse"; break;
    case Schedule::Kind::thread0_last: text += "thread0-last"; break;
  }
  text += late_stores_enabled() ? " PMOE_EMU_LATE_STORES=1" : " PMOE_EMU_LATE_STORES=0";
  return text;
}

void order_fibers(std::vector<unsigned>& order, unsigned n, bool first, std::minstd_rand& rng) {
  const auto begin = order.begin(), end = order.begin() + n;
  switch (schedule().kind) {
    case Schedule::Kind::standard:
      if (first)
        std::iota(begin, end, 0u);
      else
        std::shuffle(begin, end, rng);
      return;
    case Schedule::Kind::random:
      if (first) std::iota(begin, end, 0u);
      std::shuffle(begin, end, rng);
      return;
    case Schedule::Kind::reverse:
      for (unsigned i = 0; i < n; ++i) order[i] = n - 1 - i;
      return;
    case Schedule::Kind::thread0_last:
      for (unsigned i = 0; i + 1 < n; ++i) order[i] = i + 1;
      std::shuffle(begin, end - 1, rng);
      order[n - 1] = 0;
      return;
  }
}

uint64_t block_seed(uint64_t launch_number, unsigned block_index) {
  return mix(mix(schedule().seed ^ mix(launch_number)) + block_index);
}

BlockOrder::BlockOrder(uint64_t launch_number, unsigned total) : total_(total) {
  const Schedule& s = schedule();
  if (s.kind == Schedule::Kind::reverse) reverse_ = true;
  if (s.kind != Schedule::Kind::random || total < 2) return;
  // index -> (multiplier * index + offset) mod total, a permutation when gcd(multiplier, total)
  // is 1: cheap for any grid, and varied enough to move which block starts first and which last.
  const uint64_t r = mix(s.seed ^ mix(launch_number + 0x5bd1e995));
  offset_ = unsigned(r % total);
  multiplier_ = unsigned((r >> 32) % total) | 1u;
  while (std::gcd(multiplier_, total) != 1) multiplier_ = multiplier_ % total + 1;
}

unsigned BlockOrder::at(unsigned index) const {
  if (reverse_) return total_ - 1 - index;
  return unsigned((uint64_t(multiplier_) * index + offset_) % total_);
}

void before_kernel_starts() {
  if (schedule().kind != Schedule::Kind::random) return;
  thread_local std::minstd_rand rng(unsigned(mix(schedule().seed ^ uint64_t(
      std::hash<std::thread::id>()(std::this_thread::get_id())))));
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % 101));
}

}  // namespace pmoe::emu
