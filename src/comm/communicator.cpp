// The parts of Communicator and SymmetricMemory that every backend shares.
#include <atomic>
#include <chrono>
#include <thread>
#include <cstdlib>
#include <cstring>

#include "comm/group.hpp"
#include "core/device_runtime.hpp"
#include "comm/wait.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"

namespace pmoe {

double timeout_from_env() {
  const char* text = std::getenv("PMOE_TIMEOUT_S");
  if (!text || !*text) return 60.0;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  PMOE_CHECK(end && *end == '\0' && seconds > 0,
             "PMOE_TIMEOUT_S must be a positive number of seconds, got '", text, "'");
  return seconds;
}

Communicator::Communicator(std::shared_ptr<detail::Group> group, Device device)
    : group_(std::move(group)), device_(device), timeout_s_(timeout_from_env()) {}

Communicator::~Communicator() {
  if (side_stream_.handle) detail::destroy_stream(side_stream_);
}

Stream Communicator::side_stream() {
  PMOE_CHECK(device_.kind == Device::Kind::cuda, "side_stream: the communicator's device ",
             device_.str(), " has no streams");
  if (!side_stream_.handle) side_stream_ = detail::create_stream(device_);
  return side_stream_;
}

void Communicator::check_group() const { group_->check(rank()); }

std::unique_ptr<SymmetricMemory> Communicator::alloc_host_symmetric(size_t bytes) {
  PMOE_CHECK(device_.kind == Device::Kind::cpu, "alloc_host_symmetric: this communicator "
             "allocates symmetric memory on ", device_.str(), " only");
  return alloc_symmetric(bytes, 0);
}

void Communicator::hand_over(SymmetricMemory&, int rank) {
  throw Error(detail::cat("hand_over(rank ", rank, "): this communicator cannot admit a new process "
                          "in a lost rank's place (SocketCommunicator on one node's shared memory "
                          "can)"));
}

namespace detail {
const std::shared_ptr<Group>& group_of(const Communicator& comm) { return comm.group_; }
}  // namespace detail

void Communicator::note_rejection(const std::string& error) {
  if (error.empty() && !rejection_noted_) return;
  group_->note_rejection(rank(), error);
  rejection_noted_ = !error.empty();
}

constexpr size_t kSignalStride = SymmetricMemory::kSignalBytes / sizeof(uint64_t);
// A signal's 64-byte slot: word 0 is the epoch; word 1 counts the threads blocked on it (any
// process), so that signal() makes the wake-up system call only when someone sleeps. The futex
// is the epoch's low 32 bits (x86 and Arm are little-endian): epochs only grow, by far less than
// 2^32 between two looks, so a changed epoch always changes that word.
constexpr size_t kWaitersWord = 1;
static_assert(SymmetricMemory::kSignalBytes >= 2 * sizeof(uint64_t));

SymmetricMemory::SymmetricMemory(int rank, size_t bytes, int signal_slots,
                                 std::vector<std::byte*> data, std::vector<uint64_t*> signals,
                                 std::shared_ptr<void> keepalive,
                                 std::shared_ptr<detail::Group> group, double timeout_s,
                                 Device device)
    : rank_(rank),
      bytes_(bytes),
      signal_slots_(signal_slots),
      peer_data_(std::move(data)),
      peer_signals_(std::move(signals)),
      keepalive_(std::move(keepalive)),
      group_(std::move(group)),
      timeout_s_(timeout_s),
      device_(device) {}

SymmetricMemory::~SymmetricMemory() = default;

// For a timeout's message: the peer's rejected call where this rank can see it, else a hint.
std::string SymmetricMemory::peer_rejection(int peer) const {
  const std::string reason = group_ ? group_->rejection_of(peer) : std::string();
  if (!reason.empty())
    return detail::cat("; rank ", peer, " rejected its call (", reason,
                       "), and a call one rank rejects never reaches its peers");
  return detail::cat("; if rank ", peer, " threw, its own error says why (a call one rank ",
                     "rejects never reaches its peers)");
}

uint64_t* SymmetricMemory::signal_word(int r, int slot) const {
  return peer_signals_[r] + size_t(slot) * kSignalStride;
}

void SymmetricMemory::put(int r, size_t offset, const void* src, size_t bytes) {
  PMOE_CHECK(device_.kind == Device::Kind::cpu, "SymmetricMemory::put: memory on ",
             device_.str(), " is written by kernels, not from the host");
  std::byte* base = peer_data_[r];
  PMOE_CHECK(base != nullptr, "SymmetricMemory::put: rank ", r,
             " is not load/store reachable from rank ", rank_, " and this backend has no transport");
  std::memcpy(base + offset, src, bytes);
}

void SymmetricMemory::signal(int r, int slot, uint64_t value) {
  PMOE_CHECK(device_.kind == Device::Kind::cpu, "SymmetricMemory::signal: memory on ",
             device_.str(), " is signalled by kernels, not from the host");
  PMOE_CHECK(peer_signals_[r] != nullptr, "SymmetricMemory::signal: rank ", r,
             " is not load/store reachable from rank ", rank_, " and this backend has no transport");
  uint64_t* word = signal_word(r, slot);
  std::atomic_ref<uint64_t>(*word).store(value, std::memory_order_release);
  if (!detail::wait_policy().block) return;
  // Pairs with the waiter's increment then re-read in wait_signal: either it sees the new value,
  // or this sees its count and wakes it. One fence and a load when nobody sleeps.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (std::atomic_ref<uint64_t>(word[kWaitersWord]).load(std::memory_order_relaxed) != 0)
    detail::futex_wake_all(reinterpret_cast<const uint32_t*>(word));
}

uint64_t SymmetricMemory::read_signal(int slot) const {
  return std::atomic_ref<uint64_t>(*signal_word(rank_, slot)).load(std::memory_order_acquire);
}

void SymmetricMemory::wait_signal(int slot, uint64_t value, const WaitFor& what) const {
  wait_signal_watched(slot, value, what, [&] { group_->check(rank_); }, timeout_s_);
}

void SymmetricMemory::wait_signal(int slot, uint64_t value, const WaitFor& what,
                                  const std::function<void()>& watch, double timeout_s) const {
  wait_signal_watched(slot, value, what, [&] {
    group_->check_failed(rank_);
    watch();
  }, timeout_s);
}

template <typename Watch>
void SymmetricMemory::wait_signal_watched(int slot, uint64_t value, const WaitFor& what,
                                          Watch&& watch, double timeout_s) const {
  PMOE_CHECK(device_.kind == Device::Kind::cpu, "SymmetricMemory::wait_signal: memory on ",
             device_.str(), " is awaited by kernels, not from the host");
  auto arrived = [&] { return read_signal(slot) >= value; };
  detail::wait_until(
      timeout_s, arrived,
      [&] {
        // A signal sent before its sender ended still counts: the watch is asked before the
        // last look at the signal.
        try {
          watch();
        } catch (const Error& e) {  // say which op gave up on which peer
          if (arrived()) return;
          throw Error(detail::cat(what.op, " (waiting for rank ", what.peer, ": ", what.event,
                                  "): ", e.what()));
        } catch (...) {
          if (arrived()) return;
          throw;
        }
        progress();
      },
      [&] {
        throw Error(detail::cat(what.op, " on rank ", rank_, ": rank ", what.peer,
                                " did not arrive within ", timeout_s, " s (waited for ",
                                what.event, ": signal ", slot, " to reach ", value, ", it is at ",
                                read_signal(slot), ")", peer_rejection(what.peer)));
      },
      [&](std::chrono::nanoseconds most) {
        if (polled_transport_) {  // the signal may be in a message only progress() applies
          std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(
              most, std::chrono::microseconds(50)));
          return;
        }
        uint64_t* word = signal_word(rank_, slot);
        std::atomic_ref<uint64_t> waiters(word[kWaitersWord]);
        waiters.fetch_add(1, std::memory_order_seq_cst);
        const uint64_t seen = std::atomic_ref<uint64_t>(*word).load(std::memory_order_seq_cst);
        if (seen < value)
          detail::futex_wait(reinterpret_cast<const uint32_t*>(word), uint32_t(seen), most);
        waiters.fetch_sub(1, std::memory_order_relaxed);
      });
}

}  // namespace pmoe
