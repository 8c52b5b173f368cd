// This compilation's backends (src/backends/registry.hpp): the ops on its kernels. Compiled twice
// (src/cuda/flavor.hpp), so the GPU and the emulated device each have one table.
#include "backends/registry.hpp"
#include "cuda/flavor.hpp"

namespace pmoe::detail::inline PMOE_CUDA_FLAVOR {

// The makers, each defined beside its backend: all_to_all/backend.cu, overlap/all_gather_gemm.cu,
// overlap/gemm_reduce_scatter.cu, moe/simple_moe.cu, moe/tp_moe.cu, moe/ep_moe.cu.
std::unique_ptr<AllToAllBackend> make_device_all_to_all(Communicator& comm,
                                                        const AllToAllConfig& config);
std::unique_ptr<OverlapBackend> make_device_all_gather_gemm(Communicator& comm,
                                                            const OverlapConfig& config);
std::unique_ptr<OverlapBackend> make_device_gemm_reduce_scatter(Communicator& comm,
                                                                const OverlapConfig& config);
namespace moe {
std::unique_ptr<MoeBackend> make_simple(const MoeConfig& config, int max_tokens, Device device,
                                        Stream stream);
std::unique_ptr<MoeBackend> make_tp(Communicator& comm, const MoeConfig& config, int max_tokens);
std::unique_ptr<MoeBackend> make_ep(Communicator& comm, const MoeConfig& config, int max_tokens,
                                    const EpMoeOptions& options);
}  // namespace moe

const Backends& cuda_backends() {
  static const Backends table{
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
