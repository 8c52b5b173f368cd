// The emulated device's execution of one kernel launch: a grid of blocks, run by a fixed pool of
// host threads per device (its resident blocks), each block's threads as fibers on the host
// thread that took the block.
#pragma once

#include <functional>
#include <memory>

#include "cuda/emulator/runtime_api.hpp"

namespace pmoe::emu {

// The emulated device's shape. Read once from the environment:
//   PMOE_EMU_DEVICES (default 4), PMOE_EMU_SMS (4), PMOE_EMU_BLOCKS_PER_SM (4).
// At most SMS x BLOCKS_PER_SM blocks of a device run at once, whatever their kernels: a block
// keeps its slot until it returns, so spinning blocks can starve the kernels queued behind them,
// as on a GPU.
struct DeviceShape {
  int devices, sms, blocks_per_sm;
  int resident_blocks() const { return sms * blocks_per_sm; }
};
const DeviceShape& device_shape();

// Runs `body` once per thread of every block of the grid on `device` and returns when the last
// block has returned and its late stores landed. Blocks start in the schedule's order
// (schedule.hpp; index order by default) as slots free up (first come, first served across
// launches); `launch_number` (the launching host thread's count of launches) seeds the
// schedule's orders. Returns cudaErrorLaunchFailure if a thread threw (its message goes to
// stderr, with the schedule to repeat the run), cudaErrorInvalidValue if PMOE_EMU_SCHEDULE names
// no schedule. The launch's counts (kernel_counts.hpp) are recorded under `name`.
cuda_api::cudaError_t run_grid(int device, cuda_api::dim3 grid, cuda_api::dim3 block,
                               const std::function<void()>& body, uint64_t launch_number,
                               const char* name);

}  // namespace pmoe::emu
