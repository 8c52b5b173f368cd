// pmoe::start_counting_kernels and stop_counting_kernels: the emulated device's counts, where it
// is built (src/cuda/emulator/kernel_counts.cpp); nothing elsewhere.
#include "pmoe/diagnostics/kernel_counts.hpp"

#if PMOE_HAVE_CUDA_EMULATOR
namespace pmoe::emu {
void start_counting();
std::vector<KernelCounts> stop_counting();
}  // namespace pmoe::emu
#endif

namespace pmoe {

void start_counting_kernels() {
#if PMOE_HAVE_CUDA_EMULATOR
  emu::start_counting();
#endif
}

std::vector<KernelCounts> stop_counting_kernels() {
#if PMOE_HAVE_CUDA_EMULATOR
  return emu::stop_counting();
#else
  return {};
#endif
}

}  // namespace pmoe
