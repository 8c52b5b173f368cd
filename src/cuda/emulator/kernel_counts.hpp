// The emulated device's counts of a kernel's critical path (include/pmoe/diagnostics/kernel_counts.hpp): each
// block's are gathered by its runner (grid.cpp), merged into its launch's, and recorded when
// counting is on.
#pragma once

#include <cstdint>
#include <vector>

#include "pmoe/diagnostics/kernel_counts.hpp"

namespace pmoe::emu {

// One block's counts, then a launch's (the largest of its blocks').
struct BlockCounts {
  int barrier_rounds = 0;
  bool waited_on_own_grid = false;
  bool spun = false;
  int64_t serial_steps = 0;  // the largest of its threads'
  int64_t bytes_read = 0, bytes_written = 0;  // the sums of its threads'
  int system_fences = 0;                      // the sum of its threads'
};

struct LaunchCounts {
  unsigned blocks = 0;
  int barrier_rounds = 0, blocks_waiting_on_own_grid = 0, blocks_that_spun = 0;
  int64_t serial_steps = 0;
  int64_t bytes_read = 0, bytes_written = 0;
  int system_fences = 0;
  void add(const BlockCounts& b);
};

// Records a finished launch under `name`, if counting is on.
void record_launch(const char* name, const LaunchCounts& counts);
// pmoe::start_counting_kernels and stop_counting_kernels, on this device.
void start_counting();
std::vector<KernelCounts> stop_counting();

// Called from kernel code (src/cuda/launch.cuh): what the device cannot see for itself.
void count_wait_on_own_grid();        // the calling block waits for a block of its own grid
void count_serial_steps(int64_t n);   // the calling thread ran n more steps of a growing loop
void count_bytes_read(int64_t n);     // the calling thread read n bytes of global memory
void count_bytes_written(int64_t n);  // ... and wrote n
void count_system_fence();            // a fence or release of system scope

}  // namespace pmoe::emu
