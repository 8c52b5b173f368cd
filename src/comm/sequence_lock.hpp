// A sequence lock over memory that processes share: one writer, any number of readers, no lock a
// dead writer could leave held. The writer makes the sequence odd, stores, and makes it even
// again; a reader keeps what it loaded only if the sequence was even and unchanged across its
// loads. Every field is stored and loaded as a relaxed atomic (std::atomic_ref), so a torn read
// is detected and thrown away, never a data race. The rejection board and the peer-loss board
// use it.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>

namespace pmoe::detail {

// Runs write() (relaxed atomic stores) as one update of what `sequence` guards.
template <typename Write>
void write_sequenced(uint64_t& sequence, Write&& write) {
  std::atomic_ref<uint64_t> seq(sequence);
  const uint64_t before = seq.load(std::memory_order_relaxed);
  seq.store(before + 1, std::memory_order_relaxed);  // odd: being written
  std::atomic_thread_fence(std::memory_order_release);
  write();
  seq.store(before + 2, std::memory_order_release);
}

// Runs read() (relaxed atomic loads) once. The sequence it read under (even; 0: never written),
// or nullopt when a write was in progress or ran across the read (then drop what read() loaded).
template <typename Read>
std::optional<uint64_t> read_sequenced(uint64_t& sequence, Read&& read) {
  std::atomic_ref<uint64_t> seq(sequence);
  const uint64_t first = seq.load(std::memory_order_acquire);
  if (first % 2 == 1) return std::nullopt;
  read();
  std::atomic_thread_fence(std::memory_order_acquire);
  if (seq.load(std::memory_order_relaxed) != first) return std::nullopt;
  return first;
}

}  // namespace pmoe::detail
