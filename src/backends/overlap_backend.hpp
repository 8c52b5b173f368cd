// The boundary between the overlap ops' front end (validation, the broken state) and a backend's
// data path: the CPU's (src/cpu/all_gather_gemm.cpp, gemm_reduce_scatter.cpp) or a device's
// (src/cuda/overlap), made through src/backends/registry.hpp. A backend sees arguments already
// checked against the config.
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

}  // namespace pmoe::detail
