// The emulated remote path's proxy: see remote.hpp.
#include "cuda/emulator/remote.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <utility>

#include "cuda/emulator/device_api.hpp"
#include "cuda/emulator/remote_path.hpp"
#include "cuda/emulator/schedule.hpp"
#include "pmoe/error.hpp"

namespace pmoe::emu {
namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::atomic<bool> network_held{false};
std::mutex proxies_mutex;
std::set<const RemoteProxy*> proxies;  // every live proxy of this process, for unread_remote_puts

// A signal's pause: long enough for a receiver that trusts it to read what it does not cover
// before that lands (a waiting block polls every 20 us).
constexpr auto kAfterSignal = std::chrono::microseconds(100);

}  // namespace

Coop calling_coop() {
  const ThreadState* me = current_thread;
  if (!me) return {};
  return {me, me->block_idx.x, me->block_idx.y, me->block_idx.z};
}

uint64_t gin_signal_start(int rank, int slot) {
  // At least 2^32: more than any count of calls a test makes, so that a kernel that forgot its
  // baseline sees every wait already met.
  return splitmix(schedule().seed * 0x100000001b3ull + uint64_t(rank) * 65537u + uint64_t(slot)) |
         (uint64_t(1) << 32);
}

void start_gin_signals(uint64_t* signals, size_t signal_stride, int slots, int rank) {
  PMOE_CHECK(signal_stride > kGinSignalWord, "emulated remote path: signal slots ",
             signal_stride, " words apart leave no room for GIN's own word");
  for (int s = 0; s < slots; ++s)
    std::atomic_ref<uint64_t>(signals[size_t(s) * signal_stride + kGinSignalWord])
        .store(gin_signal_start(rank, s), std::memory_order_release);
}

void hold_remote_network(bool held) { network_held.store(held, std::memory_order_release); }

size_t unread_remote_puts() {
  std::lock_guard lock(proxies_mutex);
  size_t n = 0;
  for (const RemoteProxy* p : proxies) n += p->unread_puts();
  return n;
}

RemoteProxy::RemoteProxy(int rank, std::vector<std::byte*> regions, std::vector<uint64_t*> signals,
                         size_t signal_stride, uint64_t seed, bool by_hand)
    : rank_(rank),
      regions_(std::move(regions)),
      signals_(std::move(signals)),
      signal_stride_(signal_stride),
      puts_to_(regions_.size()),
      random_(splitmix(seed * 0x9E3779B97F4A7C15ull + uint64_t(rank)) | 1) {
  PMOE_CHECK(signal_stride > kGinSignalWord, "emulated remote path: signal slots ", signal_stride,
             " words apart leave no room for GIN's own word");
  {
    std::lock_guard lock(proxies_mutex);
    proxies.insert(this);
  }
  if (!by_hand) thread_ = std::thread([this] { run(); });
}

RemoteProxy::~RemoteProxy() {
  {
    std::lock_guard lock(proxies_mutex);
    proxies.erase(this);
  }
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  // What is still in flight is carried out: a rank whose last call is done may leave while its
  // last signals are on their way, and its peers wait for them (their memory lives until every
  // rank frees it together).
  std::unique_lock lock(mutex_);
  while (step(lock)) {
  }
}

uint64_t RemoteProxy::next_random() {
  random_ ^= random_ << 13;
  random_ ^= random_ >> 7;
  random_ ^= random_ << 17;
  return random_;
}

void RemoteProxy::put(int peer, size_t dst_offset, size_t src_offset, size_t bytes, int slot,
                      Coop coop) {
  std::lock_guard lock(mutex_);
  const uint64_t serial = next_serial_++;
  in_flight_.emplace(serial, Op{false, peer, -1, dst_offset, src_offset, bytes, coop, false, {}});
  puts_to_[size_t(peer)].insert(serial);
  if (slot >= 0)  // GIN's signalling put: the add is seen after this put and those before it
    in_flight_.emplace(next_serial_++, Op{true, peer, slot, 0, 0, 0, coop, false, {}});
  counters_.bytes += bytes;
  ++counters_.transfers;
  changed_.notify_all();
}

void RemoteProxy::signal_add(int peer, int slot) {
  std::lock_guard lock(mutex_);
  in_flight_.emplace(next_serial_++, Op{true, peer, slot, 0, 0, 0, calling_coop(), false, {}});
  ++counters_.transfers;
  changed_.notify_all();
}

void RemoteProxy::read_source(Op& op) {
  op.payload.assign(regions_[size_t(rank_)] + op.src_offset,
                    regions_[size_t(rank_)] + op.src_offset + op.bytes);
  op.read = true;
}

void RemoteProxy::flush(Coop coop) {
  std::lock_guard lock(mutex_);
  for (auto& [serial, op] : in_flight_)
    if (!op.is_signal && !op.read && op.coop == coop) read_source(op);
}

RemoteCounters RemoteProxy::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

size_t RemoteProxy::unread_puts() const {
  std::lock_guard lock(mutex_);
  size_t n = 0;
  for (const auto& [serial, op] : in_flight_) n += !op.is_signal && !op.read;
  return n;
}

bool RemoteProxy::step() {
  std::unique_lock lock(mutex_);
  return step(lock);
}

// One step, chosen at random among those GIN allows now: read a put's source, land a put whose
// source was read, or add a signal that no earlier put to its peer is still ahead of.
bool RemoteProxy::step(std::unique_lock<std::mutex>&) {
  std::vector<std::map<uint64_t, Op>::iterator> allowed;
  for (auto it = in_flight_.begin(); it != in_flight_.end(); ++it) {
    const Op& op = it->second;
    const auto& ahead = puts_to_[size_t(op.peer)];
    if (!op.is_signal || ahead.empty() || *ahead.begin() > it->first) allowed.push_back(it);
  }
  if (allowed.empty()) return false;
  const auto it = allowed[next_random() % allowed.size()];
  Op& op = it->second;
  if (!op.is_signal && !op.read) {
    read_source(op);
    return true;
  }
  if (!op.is_signal) {
    std::memcpy(regions_[size_t(op.peer)] + op.dst_offset, op.payload.data(), op.bytes);
    puts_to_[size_t(op.peer)].erase(it->first);
  } else {
    // Release: the receiver that acquires the new value sees what landed before it.
    std::atomic_ref<uint64_t>(
        signals_[size_t(op.peer)][size_t(op.slot) * signal_stride_ + kGinSignalWord])
        .fetch_add(1, std::memory_order_acq_rel);
    last_was_signal_ = true;
  }
  in_flight_.erase(it);
  changed_.notify_all();
  return true;
}

void RemoteProxy::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    changed_.wait_for(lock, std::chrono::microseconds(200), [&] {
      return stop_ || (!in_flight_.empty() && !network_held.load(std::memory_order_acquire));
    });
    if (stop_ || in_flight_.empty() || network_held.load(std::memory_order_acquire)) continue;
    // Late: a little while after the op was issued, so that kernels run ahead of the network.
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    lock.lock();
    while (!stop_ && !network_held.load(std::memory_order_acquire)) {
      last_was_signal_ = false;
      if (!step(lock)) break;
      if (last_was_signal_) {
        lock.unlock();
        std::this_thread::sleep_for(kAfterSignal);
        lock.lock();
      }
    }
  }
}

bool remote_put(RemoteProxy& proxy, int peer, size_t dst_offset, size_t src_offset, size_t bytes,
                int slot) {
  proxy.put(peer, dst_offset, src_offset, bytes, slot, calling_coop());
  return true;
}
bool remote_signal_add(RemoteProxy& proxy, int peer, int slot) {
  proxy.signal_add(peer, slot);
  return true;
}
void remote_flush(RemoteProxy& proxy) { proxy.flush(calling_coop()); }
uint64_t read_gin_signal(const uint64_t* word) {
  // atomic_ref of a const type is C++26; the load writes nothing.
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(word)).load(std::memory_order_acquire);
}

}  // namespace pmoe::emu
