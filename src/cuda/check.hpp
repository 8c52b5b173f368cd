// PMOE_CUDA_CHECK: the one way pmoe calls the CUDA runtime. A failure throws pmoe::Error naming
// the call, the file and line, and CUDA's own text.
#pragma once

#include <cuda_runtime.h>

#include "pmoe/error.hpp"

#define PMOE_CUDA_CHECK(call)                                                              \
  do {                                                                                     \
    const cudaError_t pmoe_status_ = (call);                                               \
    if (pmoe_status_ != cudaSuccess)                                                       \
      throw ::pmoe::Error(::pmoe::detail::cat(#call, " failed at ", __FILE__, ":", __LINE__, \
                                              ": ", cudaGetErrorString(pmoe_status_)));    \
  } while (0)
