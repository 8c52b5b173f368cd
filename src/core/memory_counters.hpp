// The per-thread counters behind pmoe/memory.hpp, updated by aligned_alloc_zeroed/aligned_free.
#pragma once

#include <algorithm>
#include <cstdint>

#include "pmoe/memory.hpp"

namespace pmoe::detail {

extern thread_local MemoryUsage tls_memory;

inline void count_alloc(int64_t bytes) {
  tls_memory.current_bytes += bytes;
  tls_memory.peak_bytes = std::max(tls_memory.peak_bytes, tls_memory.current_bytes);
}
inline void count_free(int64_t bytes) { tls_memory.current_bytes -= bytes; }

}  // namespace pmoe::detail
