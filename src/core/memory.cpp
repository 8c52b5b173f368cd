#include "pmoe/memory.hpp"

#include <fstream>
#include <string>

#include "core/memory_counters.hpp"

namespace pmoe {
namespace detail {

thread_local MemoryUsage tls_memory;

}  // namespace detail

MemoryUsage thread_memory() { return detail::tls_memory; }

void reset_thread_peak() { detail::tls_memory.peak_bytes = detail::tls_memory.current_bytes; }

int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "... kB"
  }
  return -1;
}

bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  if (!clear) return false;
  clear << "5";  // 5: reset the peak resident set size (proc(5))
  clear.flush();
  return bool(clear);
}

}  // namespace pmoe
