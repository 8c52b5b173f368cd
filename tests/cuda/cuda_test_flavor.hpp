// The CUDA tests are built twice (tests/CMakeLists.txt): against the emulated device's runtime
// (the default, label cuda) and against CUDA's for a GPU (PMOE_TEST_ON_GPU, label gpu). A binary's
// own CUDA calls (graph capture, memsets) reach only the runtime it was built for, so pmoe must
// use the same one: the emulated build pins it before main, and every test checks it. A failure
// in the emulated build prints the device's schedule (PMOE_EMU_SCHEDULE, PMOE_EMU_LATE_STORES).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#if !defined(PMOE_TEST_ON_GPU)
#include "cuda/emulator/runtime_api.hpp"
#include "cuda/emulator/schedule.hpp"
#endif

#include "pmoe/stream.hpp"

namespace pmoe::testing {

#if defined(PMOE_TEST_ON_GPU)
inline constexpr bool kOnEmulatedDevice = false;
// Before CUDA starts: ranks sharing the GPU deadlock under lazy module loading (run_ranks).
inline const bool kEagerModuleLoading = setenv("CUDA_MODULE_LOADING", "EAGER", 0) == 0;
#else
inline constexpr bool kOnEmulatedDevice = true;
inline const bool kEmulationPinned = setenv("PMOE_CUDA_EMULATE", "1", 1) == 0;
// Late stores unless the environment says otherwise. The schedule stays the standard one (thread 0
// first in a block's first pass) unless set; ctest runs the suite a second time with thread0-last.
inline const bool kLateStores = setenv("PMOE_EMU_LATE_STORES", "1", 0) == 0;

// A failed test names the emulated device's schedule and late-store setting, so the run can be
// repeated with them (src/cuda/emulator/schedule.hpp).
class PrintDeviceSettingsOnFailure : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& test) override {
    if (test.result() && test.result()->Failed())
      std::fprintf(stderr, "[ emulated device ] %s.%s failed with %s: set these to repeat it\n",
                   test.test_suite_name(), test.name(),
                   ::pmoe::emu::describe_device_settings().c_str());
  }
};
inline const bool kDeviceSettingsPrintedOnFailure = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new PrintDeviceSettingsOnFailure);
  return true;
}();
#endif

// Kernels this thread has launched (counted by the emulated device; a GPU build checks nothing).
inline uint64_t kernels_launched() {
#if defined(PMOE_TEST_ON_GPU)
  return 0;
#else
  return emu::kernels_launched_by_this_thread();
#endif
}
// Stream work items (kernels, GEMMs, copies, event records and waits) this thread has enqueued,
// and its waits for the device (stream, event or device synchronisations): the emulated
// device's counts; a GPU build checks nothing.
inline uint64_t stream_work() {
#if defined(PMOE_TEST_ON_GPU)
  return 0;
#else
  return emu::stream_work_by_this_thread();
#endif
}
inline uint64_t host_syncs() {
#if defined(PMOE_TEST_ON_GPU)
  return 0;
#else
  return emu::host_syncs_by_this_thread();
#endif
}

}  // namespace pmoe::testing

// In a test body: the GPU build skips where no GPU is visible (it is registered with ctest only
// where one is); the emulated build never skips, and fails if pmoe chose another runtime.
#define PMOE_REQUIRE_CUDA_RUNTIME()                                                          \
  do {                                                                                        \
    if (!::pmoe::testing::kOnEmulatedDevice && ::pmoe::cuda_device_count() == 0)              \
      GTEST_SKIP() << "no GPU visible";                                                       \
    ASSERT_EQ(::pmoe::cuda_emulated(), ::pmoe::testing::kOnEmulatedDevice)                    \
        << "pmoe chose another CUDA runtime than this test was built for (PMOE_CUDA_EMULATE)"; \
  } while (0)
