// The emulated remote path's proxy: see remote.hpp.
#include "cuda/emulator/remote.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <utility>
#include <climits>
#include <exception>

#include "cuda/emulator/remote_path.hpp"
#include "pmoe/error.hpp"

namespace pmoe::emu {

RemoteProxy::RemoteProxy(int rank, std::vector<std::byte*> regions, std::vector<uint64_t*> signals,
                         size_t signal_stride, int signal_slots, bool by_hand)
    : rank_(rank),
      regions_(std::move(regions)),
      signals_(std::move(signals)),
      signal_stride_(signal_stride),
      queues_(regions_.size()),
      added_(regions_.size(), std::vector<uint64_t>(size_t(signal_slots), 0)) {
  random_ ^= uint64_t(rank + 1) * 0xBF58476D1CE4E5B9ull;
  if (!by_hand) thread_ = std::thread([this] { run(); });
}

bool RemoteProxy::deliver_one() {
  std::unique_lock lock(mutex_);
  return deliver_one(lock);
}

RemoteProxy::~RemoteProxy() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RemoteProxy::put(int peer, size_t dst_offset, size_t src_offset, size_t bytes, int slot) {
  std::lock_guard lock(mutex_);
  const uint64_t serial = next_serial_++;
  queues_[size_t(peer)].push_back(Op{serial, slot, dst_offset, src_offset, bytes});
  pending_.insert(serial);
  counters_.bytes += bytes;
  ++counters_.transfers;
  changed_.notify_all();
}

void RemoteProxy::signal_add(int peer, int slot) {
  std::lock_guard lock(mutex_);
  const uint64_t serial = next_serial_++;
  queues_[size_t(peer)].push_back(Op{serial, slot, 0, SIZE_MAX, 0});
  pending_.insert(serial);
  ++counters_.transfers;
  changed_.notify_all();
}

void RemoteProxy::flush() {
  std::unique_lock lock(mutex_);
  const uint64_t issued = next_serial_;
  // Bounded: a proxy that stopped delivering (an error) lets the kernel go on to its own
  // bounded waits, which report.
  changed_.wait_for(lock, std::chrono::seconds(60), [&] {
    return !error_.empty() || stop_ || pending_.empty() || *pending_.begin() >= issued;
  });
}

RemoteCounters RemoteProxy::counters() const {
  std::lock_guard lock(mutex_);
  return counters_;
}

std::string RemoteProxy::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

// One op of a random peer's queue: a random put before its first signal, or that signal when no
// put is before it. False if every queue is empty.
bool RemoteProxy::deliver_one(std::unique_lock<std::mutex>& lock) {
  auto next = [&] {
    random_ ^= random_ << 13;
    random_ ^= random_ >> 7;
    random_ ^= random_ << 17;
    return random_;
  };
  std::vector<int> busy;
  for (size_t p = 0; p < queues_.size(); ++p)
    if (!queues_[p].empty()) busy.push_back(int(p));
  if (busy.empty()) return false;
  const int peer = busy[next() % busy.size()];
  auto& queue = queues_[size_t(peer)];
  size_t puts = 0;  // the puts before the first signal
  while (puts < queue.size() && queue[puts].slot < 0) ++puts;
  const size_t pick = puts > 0 ? next() % puts : 0;
  const Op op = queue[pick];
  queue.erase(queue.begin() + std::ptrdiff_t(pick));
  // Delivered without the lock: the memory's put may block on a transport.
  lock.unlock();
  std::string failure;
  try {
    if (op.src_offset != SIZE_MAX && op.bytes > 0)
      std::memcpy(regions_[size_t(peer)] + op.dst_offset, regions_[size_t(rank_)] + op.src_offset,
                  op.bytes);
    if (op.slot >= 0) {
      uint64_t value = 0;
      {
        std::lock_guard relock(mutex_);
        value = ++added_[size_t(peer)][size_t(op.slot)];
      }
      std::atomic_ref<uint64_t>(signals_[size_t(peer)][size_t(op.slot) * signal_stride_])
          .store(value, std::memory_order_release);
    }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  lock.lock();
  pending_.erase(op.serial);
  if (!failure.empty() && error_.empty()) error_ = failure;
  changed_.notify_all();
  return true;
}

void RemoteProxy::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] {
      if (stop_) return true;
      for (const auto& q : queues_)
        if (!q.empty()) return true;
      return false;
    });
    if (stop_) return;
    // Late: a little while after the op was queued, so that kernels run ahead of delivery.
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    lock.lock();
    while (!stop_ && deliver_one(lock)) {
    }
  }
}

bool remote_put(RemoteProxy& proxy, int peer, size_t dst_offset, size_t src_offset, size_t bytes,
                int slot) {
  proxy.put(peer, dst_offset, src_offset, bytes, slot);
  return true;
}
bool remote_signal_add(RemoteProxy& proxy, int peer, int slot) {
  proxy.signal_add(peer, slot);
  return true;
}
void remote_flush(RemoteProxy& proxy) { proxy.flush(); }

}  // namespace pmoe::emu
