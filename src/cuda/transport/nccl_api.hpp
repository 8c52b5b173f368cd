// NCCL's host functions, loaded from libnccl at the first use of the GPU remote path rather than
// linked: a pmoe binary then runs wherever the CUDA runtime does, NCCL being needed only by jobs
// whose ranks span nodes (and libnccl, some 200 MB, stays out of binaries and device kits that
// never cross a node). The device API itself is header-only and compiled into the kernels, so the
// library the GIN path loads (nccl_api) must be the release whose headers pmoe was built with
// (nccl_release_mismatch): the kernels read ncclDevComm and ncclWindow_t as those headers lay
// them out.
//
// Code that calls NCCL's host API only (pmoe-bench's NCCL all-to-all-v row: communicators,
// grouped send/recv) asks for nccl_host_api() instead, which takes any NCCL of the headers' major
// release: those functions and their types are NCCL's stable ABI, so the machine's own NCCL (a
// toolkit's 2.28 beside 2.30 headers) runs it.
//
// Which file: $PMOE_NCCL_LIBRARY if set, else one the process already loaded (torch's), for the
// GIN path only where its release fits the headers, else the one CMake found beside the toolkit
// (PMOE_NCCL_LIBRARY_PATH, baked in), else "libnccl.so.2" from the loader's path.
#pragma once

#include <nccl.h>
#include <nccl_device.h>

#include <string>

#include "pmoe/error.hpp"

namespace pmoe::cuda {

// NCCL's host API: communicators and point-to-point (pmoe-bench's NCCL all-to-all-v row,
// tools/pmoe-bench/nccl_all_to_all_v.hpp), and the GIN path's set-up.
struct NcclHostApi {
  std::string path;  // the file loaded
  int version = 0;   // ncclGetVersion's code, 22809 for 2.28.9
  decltype(&ncclGetVersion) GetVersion;
  decltype(&ncclGetErrorString) GetErrorString;
  decltype(&ncclGetLastError) GetLastError;
  decltype(&ncclGetUniqueId) GetUniqueId;
  decltype(&ncclCommInitRank) CommInitRank;
  decltype(&ncclCommFinalize) CommFinalize;
  decltype(&ncclCommDestroy) CommDestroy;
  decltype(&ncclSend) Send;
  decltype(&ncclRecv) Recv;
  decltype(&ncclGroupStart) GroupStart;
  decltype(&ncclGroupEnd) GroupEnd;
};

// The host API plus what the GIN path's device API needs on the host: symmetric memory, windows
// and device communicators, whose layouts the kernels read as the headers lay them out.
struct NcclApi : NcclHostApi {
  decltype(&ncclMemAlloc) MemAlloc;
  decltype(&ncclMemFree) MemFree;
  decltype(&ncclCommWindowRegister) CommWindowRegister;
  decltype(&ncclCommWindowDeregister) CommWindowDeregister;
  decltype(&ncclDevCommCreate) DevCommCreate;
  decltype(&ncclDevCommDestroy) DevCommDestroy;
};

// For the GIN path: loads and checks libnccl once per process (thread-safe). Throws pmoe::Error
// naming the file tried and why (not found, a function missing, a release other than the
// headers').
const NcclApi& nccl_api();

// For host-API-only users: the library nccl_api() loaded, where it has; else one loaded and
// checked once per process (thread-safe) that has the host functions and the headers' major
// release (NCCL 2), whatever its minor. Throws pmoe::Error naming the file tried and why (not
// found, a function missing, another major release).
const NcclHostApi& nccl_host_api();

// Why `library` (an ncclGetVersion code) cannot serve the host API of headers `headers`, or ""
// where it can: only the major release must agree.
std::string nccl_host_release_mismatch(int headers, int library);

}  // namespace pmoe::cuda

// PMOE_NCCL_CHECK: the one way pmoe calls NCCL, as nccl_api().Name(args) on the GIN path and
// nccl_host_api().Name(args) elsewhere (PMOE_NCCL_HOST_CHECK). A failure throws pmoe::Error naming
// the call, the file and line, NCCL's text for the code and NCCL's last error message
// (ncclGetLastError ignores its comm argument), from the library that made the call.
#define PMOE_NCCL_CHECK_WITH(loaded, call)                                                         \
  do {                                                                                             \
    const ncclResult_t pmoe_nccl_status_ = (call);                                                 \
    if (pmoe_nccl_status_ != ncclSuccess) {                                                        \
      const auto& pmoe_nccl_ = (loaded);                                                           \
      throw ::pmoe::Error(::pmoe::detail::cat(#call, " failed at ", __FILE__, ":", __LINE__, ": ", \
                                              pmoe_nccl_.GetErrorString(pmoe_nccl_status_), " (",  \
                                              pmoe_nccl_.GetLastError(nullptr), ")"));             \
    }                                                                                              \
  } while (0)
#define PMOE_NCCL_CHECK(call) PMOE_NCCL_CHECK_WITH(::pmoe::cuda::nccl_api(), call)
#define PMOE_NCCL_HOST_CHECK(call) PMOE_NCCL_CHECK_WITH(::pmoe::cuda::nccl_host_api(), call)
