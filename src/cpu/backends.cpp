// The CPU's backends (src/backends/registry.hpp): every op on the host, with BLAS and plain copies
// into peers' symmetric memory.
#include "backends/registry.hpp"

namespace pmoe::detail {

// The makers, each beside its backend.
std::unique_ptr<AllToAllBackend> make_cpu_all_to_all(Communicator& comm,  // all_to_all.cpp
                                                      const AllToAllConfig& config);
std::unique_ptr<OverlapBackend> make_cpu_all_gather_gemm(Communicator& comm,  // all_gather_gemm.cpp
                                                         const OverlapConfig& config);
std::unique_ptr<OverlapBackend> make_cpu_gemm_reduce_scatter(  // gemm_reduce_scatter.cpp
    Communicator& comm, const OverlapConfig& config);

const Backends& cpu_backends() {
  static const Backends table{
      .name = "CPU",
      .make_all_to_all = make_cpu_all_to_all,
      .make_all_gather_gemm = make_cpu_all_gather_gemm,
      .make_gemm_reduce_scatter = make_cpu_gemm_reduce_scatter,
      .make_simple_moe = nullptr,  // the MoE layers' CPU path is still in their front ends
      .make_tp_moe = nullptr,
      .make_ep_moe = nullptr,
  };
  return table;
}

}  // namespace pmoe::detail
