// Picks the table of makers for a device: the CPU's, or that of the compilation of src/cuda whose
// runtime this process chose. The compilations a build lacks are the only #if of the choice.
#include "backends/registry.hpp"

#include "core/device_runtime.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {

// Defined by the two compilations of src/cuda (src/cuda/backends.cu), where built.
#if PMOE_HAVE_CUDA_GPU
namespace gpu {
const Backends& cuda_backends();
}
#endif
#if PMOE_HAVE_CUDA_EMULATOR
namespace emulated {
const Backends& cuda_backends();
}
#endif

const Backends& backends(Device device) {
  if (device.kind == Device::Kind::cpu) return cpu_backends();
  const DeviceRuntime& runtime = device_runtime();  // throws in a build without one
  switch (runtime.kind()) {
#if PMOE_HAVE_CUDA_GPU
    case RuntimeKind::gpu:
      return gpu::cuda_backends();
#endif
#if PMOE_HAVE_CUDA_EMULATOR
    case RuntimeKind::emulated:
      return emulated::cuda_backends();
#endif
    default:
      break;
  }
  throw Error(cat("no backends for the ", runtime.name(), " runtime in this build"));
}

}  // namespace pmoe::detail
