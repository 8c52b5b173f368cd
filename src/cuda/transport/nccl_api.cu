#include "cuda/transport/nccl_api.hpp"

#include "cuda/transport/gin_bootstrap.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

namespace pmoe::cuda {
namespace {

#ifndef PMOE_NCCL_LIBRARY_PATH
#define PMOE_NCCL_LIBRARY_PATH "libnccl.so.2"
#endif

template <typename Fn>
void bind(void* library, const std::string& path, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  PMOE_CHECK(fn != nullptr, "GIN remote path: ", path, " has no ", name, " (NCCL ", NCCL_MAJOR, ".",
             NCCL_MINOR, " or later needed)");
}

NcclApi load() {
  NcclApi api;
  const char* chosen = std::getenv("PMOE_NCCL_LIBRARY");
  void* library = nullptr;
  if (!(chosen && *chosen)) {
    // A libnccl already in the process (torch's) is the one to share, rather than a second copy.
    api.path = "libnccl.so.2";
    library = dlopen(api.path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  }
  if (!library) {
    api.path = chosen && *chosen ? chosen : PMOE_NCCL_LIBRARY_PATH;
    library = dlopen(api.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!library && !(chosen && *chosen)) {  // the baked-in path is gone: try the loader's path
    api.path = "libnccl.so.2";
    library = dlopen(api.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  PMOE_CHECK(library != nullptr, "GIN remote path: cannot load NCCL (", api.path, "): ", dlerror(),
             "; set PMOE_NCCL_LIBRARY to libnccl.so.2 of NCCL ", NCCL_MAJOR, ".", NCCL_MINOR);
  bind(library, api.path, "ncclGetVersion", api.GetVersion);
  bind(library, api.path, "ncclGetErrorString", api.GetErrorString);
  bind(library, api.path, "ncclGetLastError", api.GetLastError);
  bind(library, api.path, "ncclGetUniqueId", api.GetUniqueId);
  bind(library, api.path, "ncclCommInitRank", api.CommInitRank);
  bind(library, api.path, "ncclCommFinalize", api.CommFinalize);
  bind(library, api.path, "ncclCommDestroy", api.CommDestroy);
  bind(library, api.path, "ncclMemAlloc", api.MemAlloc);
  bind(library, api.path, "ncclMemFree", api.MemFree);
  bind(library, api.path, "ncclCommWindowRegister", api.CommWindowRegister);
  bind(library, api.path, "ncclCommWindowDeregister", api.CommWindowDeregister);
  bind(library, api.path, "ncclDevCommCreate", api.DevCommCreate);
  bind(library, api.path, "ncclDevCommDestroy", api.DevCommDestroy);
  bind(library, api.path, "ncclSend", api.Send);
  bind(library, api.path, "ncclRecv", api.Recv);
  bind(library, api.path, "ncclGroupStart", api.GroupStart);
  bind(library, api.path, "ncclGroupEnd", api.GroupEnd);
  PMOE_CHECK(api.GetVersion(&api.version) == ncclSuccess, "GIN remote path: ncclGetVersion of ",
             api.path, " failed");
  const std::string mismatch = nccl_release_mismatch(NCCL_VERSION_CODE, api.version);
  PMOE_CHECK(mismatch.empty(), "GIN remote path: ", api.path, ": ", mismatch);
  return api;  // the library stays loaded for the life of the process
}

}  // namespace

const NcclApi& nccl_api() {
  static std::mutex mutex;
  static std::unique_ptr<NcclApi> api;
  std::lock_guard lock(mutex);
  if (!api) api = std::make_unique<NcclApi>(load());  // a failure is thrown again next time
  return *api;
}

}  // namespace pmoe::cuda
