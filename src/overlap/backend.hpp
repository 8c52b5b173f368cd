// The boundary between the overlap ops' front end (validation, the broken state) and a backend's
// data path. A backend sees arguments already checked against the config.
#pragma once

#include <cstddef>
#include <memory>

#include "pmoe/overlap.hpp"

namespace pmoe::detail {

struct OverlapArgs {
  Tensor A, B, C;
};

class OverlapBackend {
 public:
  virtual ~OverlapBackend() = default;
  virtual void run(const OverlapArgs& args) = 0;
  virtual void run_serial(const OverlapArgs& args, SerialStep step) = 0;
  virtual void run_gemm_only(const OverlapArgs& args) = 0;
  virtual bool overlaps() const = 0;
  virtual size_t workspace_bytes() const = 0;
};

// The CPU backends. `config` is validated; chunks is resolved (never 0).
std::unique_ptr<OverlapBackend> make_cpu_all_gather_gemm(Communicator& comm,
                                                         const OverlapConfig& config);
std::unique_ptr<OverlapBackend> make_cpu_gemm_reduce_scatter(Communicator& comm,
                                                             const OverlapConfig& config);

// The device backends (src/cuda/overlap), on the device runtime this process chose.
std::unique_ptr<OverlapBackend> make_cuda_all_gather_gemm(Communicator& comm,
                                                          const OverlapConfig& config);
std::unique_ptr<OverlapBackend> make_cuda_gemm_reduce_scatter(Communicator& comm,
                                                              const OverlapConfig& config);

}  // namespace pmoe::detail
