// NCCL's host functions, loaded from libnccl at the first use of the GPU remote path rather than
// linked: a pmoe binary then runs wherever the CUDA runtime does, NCCL being needed only by jobs
// whose ranks span nodes (and libnccl, some 200 MB, stays out of binaries and device kits that
// never cross a node). The device API itself is header-only and compiled into the kernels, so the
// library loaded must be the release whose headers pmoe was built with (same major.minor): the
// kernels read ncclDevComm and ncclWindow_t as those headers lay them out.
//
// Which file: $PMOE_NCCL_LIBRARY if set, else the one CMake found beside the toolkit
// (PMOE_NCCL_LIBRARY_PATH, baked in), else "libnccl.so.2" from the loader's path.
#pragma once

#include <nccl.h>
#include <nccl_device.h>

#include <string>

#include "pmoe/error.hpp"

namespace pmoe::cuda {

struct NcclApi {
  std::string path;  // the file loaded
  int version = 0;   // ncclGetVersion's code, 22809 for 2.28.9
  decltype(&ncclGetVersion) GetVersion;
  decltype(&ncclGetErrorString) GetErrorString;
  decltype(&ncclGetLastError) GetLastError;
  decltype(&ncclGetUniqueId) GetUniqueId;
  decltype(&ncclCommInitRank) CommInitRank;
  decltype(&ncclCommFinalize) CommFinalize;
  decltype(&ncclCommDestroy) CommDestroy;
  decltype(&ncclMemAlloc) MemAlloc;
  decltype(&ncclMemFree) MemFree;
  decltype(&ncclCommWindowRegister) CommWindowRegister;
  decltype(&ncclCommWindowDeregister) CommWindowDeregister;
  decltype(&ncclDevCommCreate) DevCommCreate;
  decltype(&ncclDevCommDestroy) DevCommDestroy;
  // Point-to-point, for pmoe-bench's NCCL all-to-all-v row
  // (tools/pmoe-bench/nccl_all_to_all_v.hpp).
  decltype(&ncclSend) Send;
  decltype(&ncclRecv) Recv;
  decltype(&ncclGroupStart) GroupStart;
  decltype(&ncclGroupEnd) GroupEnd;
};

// Loads and checks libnccl once per process (thread-safe). Throws pmoe::Error naming the file
// tried and why (not found, a function missing, a release other than the headers').
const NcclApi& nccl_api();

}  // namespace pmoe::cuda

// PMOE_NCCL_CHECK: the one way pmoe calls NCCL, as nccl_api().Name(args). A failure throws
// pmoe::Error naming the call, the file and line, NCCL's text for the code and NCCL's last error
// message (ncclGetLastError ignores its comm argument).
#define PMOE_NCCL_CHECK(call)                                                                      \
  do {                                                                                             \
    const ncclResult_t pmoe_nccl_status_ = (call);                                                 \
    if (pmoe_nccl_status_ != ncclSuccess) {                                                        \
      const auto& pmoe_nccl_ = ::pmoe::cuda::nccl_api();                                           \
      throw ::pmoe::Error(::pmoe::detail::cat(#call, " failed at ", __FILE__, ":", __LINE__, ": ", \
                                              pmoe_nccl_.GetErrorString(pmoe_nccl_status_), " (",  \
                                              pmoe_nccl_.GetLastError(nullptr), ")"));             \
    }                                                                                              \
  } while (0)
