// The record of counted launches (kernel_counts.hpp). Counting is off unless a tool or test turns
// it on: the record grows with every launch.
#include "cuda/emulator/kernel_counts.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace pmoe::emu {
namespace {

std::atomic<bool> counting{false};
std::mutex record_mutex;
std::vector<KernelCounts> record;  // guarded by record_mutex

}  // namespace

void LaunchCounts::add(const BlockCounts& b) {
  ++blocks;
  barrier_rounds = std::max(barrier_rounds, b.barrier_rounds);
  blocks_waiting_on_own_grid += b.waited_on_own_grid ? 1 : 0;
  blocks_that_spun += b.spun ? 1 : 0;
  serial_steps = std::max(serial_steps, b.serial_steps);
  bytes_read += b.bytes_read;
  bytes_written += b.bytes_written;
  system_fences += b.system_fences;
}

void record_launch(const char* name, const LaunchCounts& c) {
  if (!counting.load(std::memory_order_acquire)) return;
  const std::string kernel = name ? name : "kernel";
  std::lock_guard lock(record_mutex);
  auto it = std::find_if(record.begin(), record.end(),
                         [&](const KernelCounts& k) { return k.kernel == kernel; });
  if (it == record.end()) it = record.insert(record.end(), KernelCounts{kernel});
  ++it->launches;
  it->blocks = std::max(it->blocks, c.blocks);
  it->barrier_rounds = std::max(it->barrier_rounds, c.barrier_rounds);
  it->blocks_waiting_on_own_grid =
      std::max(it->blocks_waiting_on_own_grid, c.blocks_waiting_on_own_grid);
  it->blocks_that_spun = std::max(it->blocks_that_spun, c.blocks_that_spun);
  it->serial_steps = std::max(it->serial_steps, c.serial_steps);
  it->bytes_read = std::max(it->bytes_read, c.bytes_read);
  it->bytes_written = std::max(it->bytes_written, c.bytes_written);
  it->total_bytes_read += c.bytes_read;
  it->total_bytes_written += c.bytes_written;
  it->system_fences = std::max(it->system_fences, c.system_fences);
}

void start_counting() {
  std::lock_guard lock(record_mutex);
  record.clear();
  counting.store(true, std::memory_order_release);
}

std::vector<KernelCounts> stop_counting() {
  std::lock_guard lock(record_mutex);
  counting.store(false, std::memory_order_release);
  return std::exchange(record, {});
}

}  // namespace pmoe::emu
