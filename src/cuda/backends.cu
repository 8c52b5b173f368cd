// This compilation's backends (src/backends/registry.hpp): the ops on its kernels. Compiled twice
// (src/cuda/flavor.hpp), so the GPU and the emulated device each have one table.
#include "backends/registry.hpp"
#include "cuda/flavor.hpp"

namespace pmoe::detail::inline PMOE_CUDA_FLAVOR {

// The makers, each beside its backend.
std::unique_ptr<AllToAllBackend> make_device_all_to_all(Communicator& comm,  // all_to_all/backend.cu
                                                         const AllToAllConfig& config);
std::unique_ptr<OverlapBackend> make_device_all_gather_gemm(  // overlap/all_gather_gemm.cu
    Communicator& comm, const OverlapConfig& config);
std::unique_ptr<OverlapBackend> make_device_gemm_reduce_scatter(  // overlap/gemm_reduce_scatter.cu
    Communicator& comm, const OverlapConfig& config);
namespace moe {
std::unique_ptr<MoeBackend> make_simple(const MoeConfig& config, int max_tokens,  // simple_moe.cu
                                        Device device, Stream stream);
std::unique_ptr<MoeBackend> make_tp(Communicator& comm, const MoeConfig& config,  // tp_moe.cu
                                    int max_tokens);
std::unique_ptr<MoeBackend> make_ep(Communicator& comm, const MoeConfig& config,  // ep_moe.cu
                                    int max_tokens, int micro_batches);
}  // namespace moe

const Backends& cuda_backends() {
  static const Backends table{
#if defined(__CUDACC__)
      .name = "CUDA",
#else
      .name = "emulated CUDA",
#endif
      .make_all_to_all = make_device_all_to_all,
      .make_all_gather_gemm = make_device_all_gather_gemm,
      .make_gemm_reduce_scatter = make_device_gemm_reduce_scatter,
      .make_simple_moe = moe::make_simple,
      .make_tp_moe = moe::make_tp,
      .make_ep_moe = moe::make_ep,
  };
  return table;
}

}  // namespace pmoe::detail::inline PMOE_CUDA_FLAVOR
