// The overlap ops' device backends: the compilation of src/cuda/overlap that matches the device
// runtime this process chose (src/core/device_runtime.hpp): nvcc's for a GPU, the host
// compiler's for the emulated device.
#include <cstring>

#include "core/device_runtime.hpp"
#include "overlap/backend.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {

#if PMOE_HAVE_CUDA_GPU
namespace gpu {
std::unique_ptr<OverlapBackend> make_device_all_gather_gemm(Communicator&, const OverlapConfig&);
std::unique_ptr<OverlapBackend> make_device_gemm_reduce_scatter(Communicator&,
                                                                const OverlapConfig&);
}  // namespace gpu
#endif
#if PMOE_HAVE_CUDA_EMULATOR
namespace emulated {
std::unique_ptr<OverlapBackend> make_device_all_gather_gemm(Communicator&, const OverlapConfig&);
std::unique_ptr<OverlapBackend> make_device_gemm_reduce_scatter(Communicator&,
                                                                const OverlapConfig&);
}  // namespace emulated
#endif

namespace {
bool emulated_runtime() { return std::strcmp(device_runtime().name(), "emulated CUDA") == 0; }
}  // namespace

std::unique_ptr<OverlapBackend> make_cuda_all_gather_gemm(Communicator& comm,
                                                          const OverlapConfig& config) {
#if PMOE_HAVE_CUDA_EMULATOR
  if (emulated_runtime()) return emulated::make_device_all_gather_gemm(comm, config);
#endif
#if PMOE_HAVE_CUDA_GPU
  if (!emulated_runtime()) return gpu::make_device_all_gather_gemm(comm, config);
#endif
  throw Error(cat("AllGatherGemm: no ", device_runtime().name(), " backend in this build"));
}

std::unique_ptr<OverlapBackend> make_cuda_gemm_reduce_scatter(Communicator& comm,
                                                              const OverlapConfig& config) {
#if PMOE_HAVE_CUDA_EMULATOR
  if (emulated_runtime()) return emulated::make_device_gemm_reduce_scatter(comm, config);
#endif
#if PMOE_HAVE_CUDA_GPU
  if (!emulated_runtime()) return gpu::make_device_gemm_reduce_scatter(comm, config);
#endif
  throw Error(cat("GemmReduceScatter: no ", device_runtime().name(), " backend in this build"));
}

}  // namespace pmoe::detail
