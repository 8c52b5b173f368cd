// The bytes a fuzzer hands a target, read as decisions. Past the end every read returns the
// smallest choice, so any input, however short, is a complete case.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace pmoe::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | byte();
    return v;
  }
  // Uniform-ish in [lo, hi] (hi - lo < 65536).
  int range(int lo, int hi) {
    const unsigned span = unsigned(hi - lo) + 1;
    const unsigned v = unsigned(byte()) << 8 | byte();
    return lo + int(v % span);
  }
  // True with probability about n / 256.
  bool chance(int n) { return byte() < n; }
  template <typename T>
  T pick(std::initializer_list<T> options) {
    return options.begin()[range(0, int(options.size()) - 1)];
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace pmoe::fuzz
