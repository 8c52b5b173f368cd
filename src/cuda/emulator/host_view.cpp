// The host's view of host-mapped words kernels store atomically (host_view.hpp says the rules).
// Few words are host-mapped (an op's error or fault word), so a map under one mutex will do.
#include "cuda/emulator/host_view.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "cuda/emulator/device_api.hpp"

namespace pmoe::emu {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kVisibleAfter = std::chrono::seconds(1);

// The last store a kernel thread made at a host-mapped location, until the host has read it.
struct Stored {
  const ThreadState* owner;
  bool overtaken = false;  // the owner stored elsewhere since: the host may see `before`
  bool fenced = false;     // the owner fenced since: its next store releases this one
  uint64_t released = 0;   // the owner's release that covers it (0: none yet)
  Clock::time_point overtaken_at{};
  size_t bytes = 0;
  std::byte before[8]{};
};

std::mutex mutex;
std::unordered_map<const void*, Stored> stored;
// The last release at a location: by whom, and its number (releases are numbered in order).
std::unordered_map<const void*, std::pair<const ThreadState*, uint64_t>> released_at;
uint64_t releases = 0;
std::atomic<bool> anything{false};  // read first: a host load with nothing to judge takes no lock

}  // namespace

void host_view_store(void* at, const void* before, size_t bytes, bool release) {
  const ThreadState* me = current_thread;
  if (!me || !late_stores_enabled() || bytes > sizeof(Stored::before) || !is_host_mapped(at))
    return;
  std::lock_guard lock(mutex);
  uint64_t number = 0;
  const auto releases_now = [&] {
    if (number == 0) released_at[at] = {me, number = ++releases};
    return number;
  };
  if (release) releases_now();
  const auto now = Clock::now();
  for (auto& [where, s] : stored) {
    if (s.owner != me || where == at) continue;
    if (!s.overtaken) s.overtaken_at = now;
    s.overtaken = true;
    if (s.released == 0 && (release || s.fenced)) s.released = releases_now();
  }
  Stored& s = stored.insert_or_assign(at, Stored{me}).first->second;
  s.bytes = bytes;
  std::memcpy(s.before, before, bytes);
  anything.store(true, std::memory_order_release);
}

void host_view_fence() {
  const ThreadState* me = current_thread;
  if (!me || !anything.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mutex);
  for (auto& entry : stored)
    if (entry.second.owner == me) entry.second.fenced = true;
}

void host_view_load(const void* at, void* value, size_t bytes, bool acquires) {
  if (current_thread || !anything.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mutex);
  const auto now = Clock::now();
  std::erase_if(stored, [&](const auto& entry) {
    return entry.second.overtaken && now - entry.second.overtaken_at > kVisibleAfter;
  });
  if (const auto it = stored.find(at); it != stored.end()) {
    if (it->second.overtaken && it->second.bytes == bytes) {
      std::memcpy(value, it->second.before, bytes);  // an older value: nothing to acquire from
      return;
    }
    stored.erase(it);  // the host saw the newest value: it can no longer be hidden
  }
  const auto release = released_at.find(at);
  if (!acquires || release == released_at.end()) return;
  const auto [owner, number] = release->second;
  std::erase_if(stored, [&](const auto& entry) {
    const Stored& s = entry.second;
    return s.owner == owner && s.released != 0 && s.released <= number;
  });
}

void host_view_synchronized() {
  if (!anything.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mutex);
  stored.clear();
  released_at.clear();
  anything.store(false, std::memory_order_relaxed);
}

}  // namespace pmoe::emu
