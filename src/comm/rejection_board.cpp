#include "comm/rejection_board.hpp"

#include <algorithm>
#include <cstring>

namespace pmoe::detail {

void write_rejection(RejectionSlot& slot, const std::string& text) {
  std::atomic_ref<uint64_t> sequence(slot.sequence);
  const uint64_t before = sequence.load(std::memory_order_relaxed);
  sequence.store(before + 1, std::memory_order_relaxed);  // odd: being written
  std::atomic_thread_fence(std::memory_order_release);
  const size_t n = std::min(text.size(), sizeof slot.text - 1);
  for (size_t i = 0; i < n; ++i)
    std::atomic_ref<char>(slot.text[i]).store(text[i], std::memory_order_relaxed);
  std::atomic_ref<char>(slot.text[n]).store('\0', std::memory_order_relaxed);
  sequence.store(before + 2, std::memory_order_release);
}

std::string read_rejection(const RejectionSlot& slot) {
  auto& writable = const_cast<RejectionSlot&>(slot);  // atomic_ref needs a non-const object
  std::atomic_ref<uint64_t> sequence(writable.sequence);
  const uint64_t first = sequence.load(std::memory_order_acquire);
  if (first == 0 || first % 2 == 1) return "";
  std::string text;
  for (size_t i = 0; i < sizeof slot.text; ++i) {
    const char c = std::atomic_ref<char>(writable.text[i]).load(std::memory_order_relaxed);
    if (c == '\0') break;
    text += c;
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  return sequence.load(std::memory_order_relaxed) == first ? text : "";
}

}  // namespace pmoe::detail
