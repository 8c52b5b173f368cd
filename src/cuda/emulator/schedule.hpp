// The emulated device's schedule: in which order a block's fibers run between two switch points
// (__syncthreads(), __nanosleep(), a thread's end), in which order a launch's blocks start, and
// how streams start their kernels. Chosen per process with PMOE_EMU_SCHEDULE:
//
//   standard (unset)  fibers in index order until the first barrier, then a new pseudo-random
//                     order after every barrier; blocks in index order
//   random:SEED       fibers in a new pseudo-random order at the start and after every barrier;
//                     blocks in a pseudo-random order; each kernel's start on its stream is
//                     delayed by 0-100 us, so streams and ranks interleave differently
//   reverse           fibers and blocks in reverse index order, always
//   thread0-last      thread 0 runs after every other thread of its block in every pass (the
//                     others in a pseudo-random order), so a value thread 0 writes to __shared__
//                     without a __syncthreads() before the others read it is always missed
//
// The pseudo-random orders depend on SEED (0 for standard and thread0-last), on the number of
// kernels the launching host thread launched before and on the block's index, so a failing run
// of one rank per host thread repeats with the same setting (how ranks' threads interleave is
// still up to the host). describe_device_settings() is what failures print to say so.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace pmoe::emu {

struct Schedule {
  enum class Kind { standard, random, reverse, thread0_last };
  Kind kind = Kind::standard;
  uint64_t seed = 0;
  bool valid = true;  // false: PMOE_EMU_SCHEDULE named no schedule (launches then fail)
};

// PMOE_EMU_SCHEDULE, read once.
const Schedule& schedule();

// "PMOE_EMU_SCHEDULE=... PMOE_EMU_LATE_STORES=..." as this process runs: what to set to repeat it.
std::string describe_device_settings();

// The order of a block's `n` fibers for its first pass (first) or after a barrier.
void order_fibers(std::vector<unsigned>& order, unsigned n, bool first, std::minstd_rand& rng);

// The seed of one block's fiber orders.
uint64_t block_seed(uint64_t launch_number, unsigned block_index);

// Which block starts `index`-th among `total` (a permutation of [0, total)), for a launch whose
// order was drawn from `launch_number`.
class BlockOrder {
 public:
  BlockOrder(uint64_t launch_number, unsigned total);
  unsigned at(unsigned index) const;

 private:
  unsigned total_, multiplier_ = 1, offset_ = 0;
  bool reverse_ = false;
};

// random:SEED only: a short pause before a kernel starts on its stream.
void before_kernel_starts();

}  // namespace pmoe::emu
