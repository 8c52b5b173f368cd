// The NCCL all-to-all-v row in a pmoe-bench built without NCCL's headers (no CUDA toolkit, or no
// NCCL 2.28.7 or later beside it): the row says why instead of a time.
#include "nccl_all_to_all_v.hpp"

#include "pmoe/error.hpp"

namespace pmoe::bench {

namespace {
constexpr const char* kWhy =
    "pmoe-bench was built without NCCL (CMake found no NCCL 2.28.7 or later beside the CUDA "
    "toolkit; set NCCL_ROOT and build again)";
}  // namespace

std::string nccl_all_to_all_v_unavailable() { return kWhy; }

std::unique_ptr<BaselinePath> make_nccl_all_to_all_v_path(Communicator&, const AllToAllConfig&,
                                                          const reference::AllToAllInputs&) {
  throw Error(kWhy);
}

}  // namespace pmoe::bench
