// What the emulated CUDA device counts of each kernel's critical path. It cannot time a kernel,
// but it runs every barrier and every wait, so it can count them: the numbers a design is judged
// by before a GPU sees it (docs/gpu-all-to-all.md). On a GPU nothing is counted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pmoe {

// One kernel's counts, the largest over its launches (and over the blocks and threads of each).
struct KernelCounts {
  std::string kernel;        // the name it was launched under ("kernel" if it gave none)
  int launches = 0;          // launches merged into this entry
  unsigned blocks = 0;       // the largest grid
  int barrier_rounds = 0;    // the most __syncthreads() rounds one block went through
  // The most blocks of one launch that waited for another block of the same launch: blocks that
  // hold an SM while they spin, and a grid that runs at the pace of one block.
  int blocks_waiting_on_own_grid = 0;
  // The most blocks of one launch that slept in a wait at all (on a peer, a stream or their grid).
  int blocks_that_spun = 0;
  // The most steps one thread took in the loops whose length grows with the tokens, experts or
  // ranks: the iterations that the kernel counts with count_serial_steps (src/cuda/launch.cuh),
  // e.g. a token walked, an expert summed, a 16-byte word copied to one destination.
  int64_t serial_steps = 0;
  // Global-memory bytes one launch read and wrote (all its blocks), the most of any launch, and
  // the sums over every launch (every rank's). Counted where kernels load and store: the row
  // copies, the vector loads of sums, every store another block, kernel or rank reads
  // (src/cuda/memory_ops.cuh). A few words of private scratch per token (slots, positions) are
  // not counted.
  int64_t bytes_read = 0, bytes_written = 0;
  int64_t total_bytes_read = 0, total_bytes_written = 0;
  // The most fences and release operations of system scope in one launch (all its threads):
  // what a kernel pays when a peer may be another GPU or the host. None is needed when every
  // peer shares the kernel's GPU.
  int system_fences = 0;
};

// Starts counting every kernel that runs on the emulated device, from any thread, clearing the
// counts so far. Nothing is counted on a GPU.
void start_counting_kernels();
// Stops counting and returns the counts of the kernels that ran since the start, merged by name
// in the order of their first launch. Empty on a GPU or in a build without the emulated device.
std::vector<KernelCounts> stop_counting_kernels();

}  // namespace pmoe
