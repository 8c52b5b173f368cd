// `pmoe-bench all-to-all --device cuda` in a build without the CUDA backend.
#include "all_to_all_cuda.hpp"
#include "pmoe/error.hpp"

namespace pmoe::bench {

CudaAllToAllResult run_all_to_all_cuda(Communicator&, const AllToAllConfig&, int, uint64_t, int,
                                       int) {
  throw Error("--device cuda: this build of pmoe has no CUDA backend");
}

}  // namespace pmoe::bench
