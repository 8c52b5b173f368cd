// AllToAll's CUDA backend in a build without CUDA: constructing one says so.
#include "all_to_all/backend.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {

std::unique_ptr<AllToAllBackend> make_cuda_all_to_all(Communicator& comm, const AllToAllConfig&) {
  throw Error(cat("AllToAll: no backend for ", comm.device().str(),
                  " in this build (configure with PMOE_CUDA=ON where the CUDA toolkit is)"));
}

}  // namespace pmoe::detail
