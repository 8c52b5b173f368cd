// The CPU's backends (src/backends/registry.hpp): every op on the host, with BLAS and plain copies
// into peers' symmetric memory.
#include "backends/registry.hpp"

namespace pmoe::detail {

// The makers, each defined beside its backend: all_to_all.cpp, all_gather_gemm.cpp,
// gemm_reduce_scatter.cpp, simple_moe.cpp, tp_moe.cpp, ep_moe.cpp.
std::unique_ptr<AllToAllBackend> make_cpu_all_to_all(Communicator& comm,
                                                     const AllToAllConfig& config);
std::unique_ptr<OverlapBackend> make_cpu_all_gather_gemm(Communicator& comm,
                                                         const OverlapConfig& config);
std::unique_ptr<OverlapBackend> make_cpu_gemm_reduce_scatter(Communicator& comm,
                                                             const OverlapConfig& config);
std::unique_ptr<MoeBackend> make_cpu_simple_moe(const MoeConfig& config, int max_tokens,
                                                Device device, Stream stream);
std::unique_ptr<MoeBackend> make_cpu_tp_moe(Communicator& comm, const MoeConfig& config,
                                            int max_tokens);
std::unique_ptr<MoeBackend> make_cpu_ep_moe(Communicator& comm, const MoeConfig& config,
                                            int max_tokens, const EpMoeOptions& options);

const Backends& cpu_backends() {
  static const Backends table{
      .make_all_to_all = make_cpu_all_to_all,
      .make_all_gather_gemm = make_cpu_all_gather_gemm,
      .make_gemm_reduce_scatter = make_cpu_gemm_reduce_scatter,
      .make_simple_moe = make_cpu_simple_moe,
      .make_tp_moe = make_cpu_tp_moe,
      .make_ep_moe = make_cpu_ep_moe,
  };
  return table;
}

}  // namespace pmoe::detail
