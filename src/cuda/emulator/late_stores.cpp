// Late stores of the emulated device: held per block on its host thread, released by fences and
// release stores of sufficient scope, by the block's end into its launch, by the kernel's end into
// memory (late_stores.hpp says the rules).
#include "cuda/emulator/late_stores.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda/emulator/device_api.hpp"

namespace pmoe::emu {
namespace {

struct HeldStore {
  std::byte* dst;
  const ThreadState* owner;  // the fiber that stored it
  uint64_t barriers;         // barriers its block had passed when it was stored
  uint8_t bytes;
  alignas(16) std::byte value[16];
};

void write(const HeldStore& s) { std::memcpy(s.dst, s.value, s.bytes); }

// The held stores of the block running on this host thread.
struct BlockHeld {
  std::vector<HeldStore> stores;
  uint64_t barriers = 0;
};
thread_local BlockHeld block_held;

int delay_us() {
  static const int us = [] {
    const char* text = std::getenv("PMOE_EMU_LATE_STORE_DELAY_US");
    const int value = text && *text ? std::atoi(text) : 200;
    return value < 0 ? 0 : value > 1000000 ? 1000000 : value;
  }();
  return us;
}

}  // namespace

bool late_stores_enabled() {
  static const bool on = [] {
    const char* text = std::getenv("PMOE_EMU_LATE_STORES");
    return text && *text && std::strcmp(text, "0") != 0;
  }();
  return on;
}

void hold_store(void* dst, const void* value, size_t bytes) {
  const ThreadState* owner = current_thread;
  if (!owner || !late_stores_enabled()) {
    std::memcpy(dst, value, bytes);
    return;
  }
  HeldStore s;
  s.dst = static_cast<std::byte*>(dst);
  s.owner = owner;
  s.barriers = block_held.barriers;
  s.bytes = uint8_t(bytes);
  std::memcpy(s.value, value, bytes);
  block_held.stores.push_back(s);
}

void release_held_stores() {
  const ThreadState* me = current_thread;
  std::vector<HeldStore>& stores = block_held.stores;
  if (!me || stores.empty()) return;
  // In order: two held stores to one address keep their program (and barrier) order.
  size_t kept = 0;
  for (size_t i = 0; i < stores.size(); ++i) {
    if (stores[i].owner == me || stores[i].barriers < block_held.barriers)
      write(stores[i]);
    else
      stores[kept++] = stores[i];
  }
  stores.resize(kept);
}

void late_stores_barrier_passed() { ++block_held.barriers; }

struct LaunchHeldStores::Impl {
  std::mutex mutex;
  std::vector<HeldStore> stores;
};

LaunchHeldStores::LaunchHeldStores() : impl_(std::make_unique<Impl>()) {}
LaunchHeldStores::~LaunchHeldStores() = default;

void late_stores_block_end(LaunchHeldStores& launch) {
  BlockHeld& held = block_held;
  held.barriers = 0;
  if (held.stores.empty()) return;
  std::lock_guard lock(launch.impl_->mutex);
  auto& to = launch.impl_->stores;
  to.insert(to.end(), held.stores.begin(), held.stores.end());
  held.stores.clear();
}

void LaunchHeldStores::kernel_end() {
  std::lock_guard lock(impl_->mutex);
  if (impl_->stores.empty()) return;
  // Late: a peer that reads without waiting for this rank's release sees the old bytes.
  if (delay_us() > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us()));
  for (const HeldStore& s : impl_->stores) write(s);
  impl_->stores.clear();
}

}  // namespace pmoe::emu
