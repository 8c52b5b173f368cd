// Late stores of the emulated device: held per block on its host thread, released by fences and
// release stores of sufficient scope, by the block's end into its launch, by the kernel's end into
// memory (late_stores.hpp says the rules).
#include "cuda/emulator/late_stores.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/emulator/device_api.hpp"
#include "cuda/emulator/host_view.hpp"

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

// Stores a fence or a release took out of the held list: invisible until delivered (written),
// by an acquire at a location an atomic write published them at, or by their kernel's end.
struct Package {
  const LaunchHeldStores* launch;
  const ThreadState* owner;  // the fiber whose fence or release made it
  uint64_t made_at;          // barriers its block had passed then
  bool by_release;           // a release operation made or published it (not only a fence and
                             // relaxed atomics)
  bool published = false;    // an atomic write put it at a location
  bool delivered = false;    // guarded by pending_mutex
  std::vector<HeldStore> stores;
};
using PackagePtr = std::shared_ptr<Package>;

std::mutex pending_mutex;
// Published packages by location; one package may be at several (a fence, then several signals).
std::unordered_map<const void*, std::vector<PackagePtr>> pending;
std::atomic<size_t> published_packages{0};  // read first: a reader with nothing to take skips the lock
std::atomic<bool> across_processes{false};

// Writes a package once (pending_mutex held).
void deliver_locked(Package& package) {
  if (package.delivered) return;
  for (const HeldStore& s : package.stores) write(s);
  package.delivered = true;
  if (package.published) published_packages.fetch_sub(1, std::memory_order_release);
}

// The held stores of the block running on this host thread, its packages not yet delivered, and
// the locations its fibers read with relaxed atomics since their last fence (a fence then makes
// it an acquire of them).
struct BlockHeld {
  std::vector<HeldStore> stores;
  uint64_t barriers = 0;
  const LaunchHeldStores* launch = nullptr;
  std::vector<PackagePtr> packages;
  std::vector<std::pair<const ThreadState*, const void*>> observed;
};
thread_local BlockHeld block_held;

bool releasable_by(const HeldStore& s, const ThreadState* me) {
  return s.owner == me || s.barriers < block_held.barriers;
}
// A package this thread's atomic write publishes: its own, or one made before a barrier it has
// passed (a fence completes before the barrier, so a write after the barrier is ordered after it,
// as thread 0's atomicAdd in last_block is).
bool covers(const Package& p, const ThreadState* me) {
  return p.owner == me || p.made_at < block_held.barriers;
}

// Moves the held stores this thread may release into a new package of the block (none if empty).
void make_package(const ThreadState* me, bool by_release) {
  std::vector<HeldStore>& stores = block_held.stores;
  auto package = std::make_shared<Package>();
  size_t kept = 0;
  for (size_t i = 0; i < stores.size(); ++i) {
    if (releasable_by(stores[i], me))
      package->stores.push_back(stores[i]);  // in order: two stores to one address keep theirs
    else
      stores[kept++] = stores[i];
  }
  stores.resize(kept);
  // Cumulativity: what another thread stored before a barrier this one passed is covered, even if
  // that thread's own fence (after the barrier) already put it in a package nobody published yet.
  for (const PackagePtr& other : block_held.packages) {
    if (other->owner == me || other->published || other->delivered) continue;
    auto& theirs = other->stores;
    size_t left = 0;
    for (size_t i = 0; i < theirs.size(); ++i) {
      if (theirs[i].barriers < block_held.barriers)
        package->stores.push_back(theirs[i]);
      else
        theirs[left++] = theirs[i];
    }
    theirs.resize(left);
  }
  if (package->stores.empty()) return;
  package->launch = block_held.launch;
  package->owner = me;
  package->made_at = block_held.barriers;
  package->by_release = by_release;
  block_held.packages.push_back(std::move(package));
}

// Drops the block's delivered packages from its list.
void forget_delivered() {
  auto& packages = block_held.packages;
  std::erase_if(packages, [](const PackagePtr& p) { return p->delivered; });
}

bool reader_side() {
  return late_stores_enabled() && !across_processes.load(std::memory_order_relaxed);
}

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

// Writes the packages this thread covers, and with `held`, the held stores it may release.
void write_now(bool held) {
  const ThreadState* me = current_thread;
  if (!me) return;
  if (held) make_package(me, /*by_release=*/true);
  if (block_held.packages.empty()) return;
  std::lock_guard lock(pending_mutex);
  for (const PackagePtr& p : block_held.packages)
    if (covers(*p, me)) deliver_locked(*p);
  forget_delivered();
}

void release_held_stores() { write_now(/*held=*/true); }
void write_fenced_stores() { write_now(/*held=*/false); }

void fence_of_device_scope() {
  const ThreadState* me = current_thread;
  if (!me || !late_stores_enabled()) return;
  host_view_fence();
  if (!reader_side()) {
    release_held_stores();
    return;
  }
  // Release: into a package that this thread's next atomic writes publish (fence then relaxed
  // store or atomicAdd = a release, PTX).
  make_package(me, /*by_release=*/false);
  // Acquire: of what this thread's relaxed reads since its last fence observed.
  auto& observed = block_held.observed;
  size_t kept = 0;
  for (size_t i = 0; i < observed.size(); ++i) {
    if (observed[i].first != me) {
      observed[kept++] = observed[i];
      continue;
    }
    if (published_packages.load(std::memory_order_acquire) == 0) continue;
    std::lock_guard lock(pending_mutex);
    const auto it = pending.find(observed[i].second);
    if (it == pending.end()) continue;
    for (const PackagePtr& p : it->second) deliver_locked(*p);
    pending.erase(it);
  }
  observed.resize(kept);
}

void atomic_write_at(const void* at, bool releases) {
  const ThreadState* me = current_thread;
  if (!me || !late_stores_enabled()) return;
  if (releases) make_package(me, /*by_release=*/true);
  if (block_held.packages.empty()) return;
  if (!reader_side()) {
    write_now(/*held=*/false);
    return;
  }
  std::lock_guard lock(pending_mutex);
  auto& here = pending[at];
  for (const PackagePtr& p : block_held.packages) {
    if (p->delivered || !covers(*p, me)) continue;
    p->by_release = p->by_release || releases;
    if (std::find(here.begin(), here.end(), p) != here.end()) continue;
    if (!p->published) published_packages.fetch_add(1, std::memory_order_relaxed);
    p->published = true;
    here.push_back(p);
  }
  if (here.empty()) pending.erase(at);
  forget_delivered();
}

void atomic_read_at(const void* at, bool acquires) {
  const ThreadState* me = current_thread;
  // A host thread (no kernel thread) acquires too: a host-mapped word a kernel released at.
  if (!reader_side() || (!me && !acquires)) return;
  if (!acquires) {
    auto& observed = block_held.observed;
    for (const auto& [who, where] : observed)
      if (who == me && where == at) return;
    observed.emplace_back(me, at);
    return;
  }
  if (published_packages.load(std::memory_order_acquire) == 0) return;
  std::lock_guard lock(pending_mutex);
  const auto it = pending.find(at);
  if (it == pending.end()) return;
  for (const PackagePtr& p : it->second) deliver_locked(*p);
  pending.erase(it);
}

void late_stores_shared_across_processes() {
  across_processes.store(true, std::memory_order_relaxed);
}

void late_stores_block_start(const LaunchHeldStores& launch) { block_held.launch = &launch; }

void late_stores_barrier_passed() {
  ++block_held.barriers;
  // The block's threads may read what a release of one of them published once they pass a
  // barrier; one memory image cannot show it to them and hide it from other blocks, so every
  // reader sees it now. Stores published only by a fence and a relaxed atomic (last_block's
  // handshake) stay pending for their acquirer (late_stores.hpp).
  auto& packages = block_held.packages;
  bool any = false;
  for (const PackagePtr& p : packages) any = any || (p->published && p->by_release);
  if (!any) return;
  std::lock_guard lock(pending_mutex);
  for (const PackagePtr& p : packages)
    if (p->published && p->by_release) deliver_locked(*p);
  forget_delivered();
}

struct LaunchHeldStores::Impl {
  std::mutex mutex;
  std::vector<HeldStore> stores;
  std::vector<PackagePtr> packages;  // of its ended blocks, not yet delivered
};

LaunchHeldStores::LaunchHeldStores() : impl_(std::make_unique<Impl>()) {}
LaunchHeldStores::~LaunchHeldStores() = default;

void late_stores_block_end(LaunchHeldStores& launch) {
  BlockHeld& held = block_held;
  held.barriers = 0;
  held.launch = nullptr;
  held.observed.clear();
  if (held.stores.empty() && held.packages.empty()) return;
  std::lock_guard lock(launch.impl_->mutex);
  auto& to = launch.impl_->stores;
  to.insert(to.end(), held.stores.begin(), held.stores.end());
  held.stores.clear();
  auto& packages = launch.impl_->packages;
  packages.insert(packages.end(), held.packages.begin(), held.packages.end());
  held.packages.clear();
}

void LaunchHeldStores::kernel_end() {
  std::lock_guard lock(impl_->mutex);
  if (impl_->stores.empty() && impl_->packages.empty()) return;
  // Late: a peer that reads without waiting for this rank's release sees the old bytes.
  if (delay_us() > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us()));
  if (!impl_->packages.empty()) {
    std::lock_guard pending_lock(pending_mutex);
    for (const PackagePtr& p : impl_->packages) deliver_locked(*p);  // released first
    // Their places in `pending` are dropped as readers find them delivered, or here.
    for (auto it = pending.begin(); it != pending.end();) {
      std::erase_if(it->second, [](const PackagePtr& p) { return p->delivered; });
      it = it->second.empty() ? pending.erase(it) : std::next(it);
    }
    impl_->packages.clear();
  }
  for (const HeldStore& s : impl_->stores) write(s);
  impl_->stores.clear();
}

}  // namespace pmoe::emu
