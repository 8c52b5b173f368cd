#include "comm/rejection_board.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "comm/sequence_lock.hpp"

namespace pmoe::detail {

void write_rejection(RejectionSlot& slot, const std::string& text) {
  write_sequenced(slot.sequence, [&] {
    const size_t n = std::min(text.size(), sizeof slot.text - 1);
    for (size_t i = 0; i < n; ++i)
      std::atomic_ref<char>(slot.text[i]).store(text[i], std::memory_order_relaxed);
    std::atomic_ref<char>(slot.text[n]).store('\0', std::memory_order_relaxed);
  });
}

std::string read_rejection(const RejectionSlot& slot) {
  auto& writable = const_cast<RejectionSlot&>(slot);  // atomic_ref needs a non-const object
  std::string text;
  const auto seen = read_sequenced(writable.sequence, [&] {
    for (size_t i = 0; i < sizeof slot.text; ++i) {
      const char c = std::atomic_ref<char>(writable.text[i]).load(std::memory_order_relaxed);
      if (c == '\0') break;
      text += c;
    }
  });
  return seen && *seen != 0 ? text : "";
}

}  // namespace pmoe::detail
