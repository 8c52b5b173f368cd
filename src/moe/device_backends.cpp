// The MoE layers' device data paths: the compilation of src/cuda/moe that matches the device
// runtime this process chose: nvcc's for a GPU, the host compiler's for the emulated device.
#include <cstring>

#include "core/device_runtime.hpp"
#include "moe/device_moe.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {

#define PMOE_MOE_FACTORIES                                                       \
  std::unique_ptr<DeviceMoe> make_simple(const MoeConfig&, int, Device, Stream); \
  std::unique_ptr<DeviceMoe> make_tp(Communicator&, const MoeConfig&, int);      \
  std::unique_ptr<DeviceMoe> make_ep(Communicator&, const MoeConfig&, int, int);
#if PMOE_HAVE_CUDA_GPU
namespace gpu::moe {
PMOE_MOE_FACTORIES
}
#endif
#if PMOE_HAVE_CUDA_EMULATOR
namespace emulated::moe {
PMOE_MOE_FACTORIES
}
#endif
#undef PMOE_MOE_FACTORIES

namespace {
bool emulated_runtime() { return std::strcmp(device_runtime().name(), "emulated CUDA") == 0; }

// Calls the factory of the runtime in use, or says that the build has none.
template <typename Emulated, typename Gpu>
std::unique_ptr<DeviceMoe> pick(const char* layer, [[maybe_unused]] Emulated emulated,
                                [[maybe_unused]] Gpu gpu) {
#if PMOE_HAVE_CUDA_EMULATOR
  if (emulated_runtime()) return emulated();
#endif
#if PMOE_HAVE_CUDA_GPU
  if (!emulated_runtime()) return gpu();
#endif
  throw Error(cat(layer, ": no ", device_runtime().name(), " backend in this build"));
}
}  // namespace

#if PMOE_HAVE_CUDA_EMULATOR
#define PMOE_EMULATED(call) [&] { return emulated::moe::call; }
#else
#define PMOE_EMULATED(call) 0
#endif
#if PMOE_HAVE_CUDA_GPU
#define PMOE_GPU(call) [&] { return gpu::moe::call; }
#else
#define PMOE_GPU(call) 0
#endif

std::unique_ptr<DeviceMoe> make_device_simple_moe(const MoeConfig& config, int max_tokens,
                                                  Device device, Stream stream) {
  return pick("SimpleMoe", PMOE_EMULATED(make_simple(config, max_tokens, device, stream)),
              PMOE_GPU(make_simple(config, max_tokens, device, stream)));
}
std::unique_ptr<DeviceMoe> make_device_tp_moe(Communicator& comm, const MoeConfig& config,
                                              int max_tokens) {
  return pick("TpMoe", PMOE_EMULATED(make_tp(comm, config, max_tokens)),
              PMOE_GPU(make_tp(comm, config, max_tokens)));
}
std::unique_ptr<DeviceMoe> make_device_ep_moe(Communicator& comm, const MoeConfig& config,
                                              int max_tokens, int micro_batches) {
  return pick("EpMoe", PMOE_EMULATED(make_ep(comm, config, max_tokens, micro_batches)),
              PMOE_GPU(make_ep(comm, config, max_tokens, micro_batches)));
}

}  // namespace pmoe::detail
