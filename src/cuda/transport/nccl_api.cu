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

// Not named `bind`: for a std::string argument, ADL would pick std::bind, which binds nothing.
template <typename Fn>
void bind_symbol(void* library, const std::string& path, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  PMOE_CHECK(fn != nullptr, "GIN remote path: ", path, " has no ", name, " (NCCL ", NCCL_MAJOR, ".",
             NCCL_MINOR, " or later needed)");
}

// The release of a loaded libnccl, 0 where it has no working ncclGetVersion.
int release_of(void* library) {
  int version = 0;
  const auto get = reinterpret_cast<decltype(&ncclGetVersion)>(dlsym(library, "ncclGetVersion"));
  return get && get(&version) == ncclSuccess ? version : 0;
}

// Which libnccl: $PMOE_NCCL_LIBRARY if set; else one already in the process (torch's: sharing it
// saves a second copy and its threads) where it fits the headers; else the one CMake found; else
// the loader's libnccl.so.2. RTLD_LOCAL: a second NCCL in the process keeps to itself.
void* open_library(std::string& path) {
  const char* chosen = std::getenv("PMOE_NCCL_LIBRARY");
  if (chosen && *chosen) {
    path = chosen;
    return dlopen(chosen, RTLD_NOW | RTLD_LOCAL);
  }
  path = "libnccl.so.2";
  if (void* loaded = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
    if (nccl_release_mismatch(NCCL_VERSION_CODE, release_of(loaded)).empty()) return loaded;
    dlclose(loaded);  // another release (a 2.28 build beside torch's 2.30): load pmoe's own
  }
  path = PMOE_NCCL_LIBRARY_PATH;
  if (void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return library;
  path = "libnccl.so.2";  // the baked-in path is gone: try the loader's path
  return dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
}

NcclApi load() {
  NcclApi api;
  void* library = open_library(api.path);
  PMOE_CHECK(library != nullptr, "GIN remote path: cannot load NCCL (", api.path, "): ", dlerror(),
             "; set PMOE_NCCL_LIBRARY to libnccl.so.2 of NCCL ", NCCL_MAJOR, ".", NCCL_MINOR);
  try {
    bind_symbol(library, api.path, "ncclGetVersion", api.GetVersion);
    bind_symbol(library, api.path, "ncclGetErrorString", api.GetErrorString);
    bind_symbol(library, api.path, "ncclGetLastError", api.GetLastError);
    bind_symbol(library, api.path, "ncclGetUniqueId", api.GetUniqueId);
    bind_symbol(library, api.path, "ncclCommInitRank", api.CommInitRank);
    bind_symbol(library, api.path, "ncclCommFinalize", api.CommFinalize);
    bind_symbol(library, api.path, "ncclCommDestroy", api.CommDestroy);
    bind_symbol(library, api.path, "ncclMemAlloc", api.MemAlloc);
    bind_symbol(library, api.path, "ncclMemFree", api.MemFree);
    bind_symbol(library, api.path, "ncclCommWindowRegister", api.CommWindowRegister);
    bind_symbol(library, api.path, "ncclCommWindowDeregister", api.CommWindowDeregister);
    bind_symbol(library, api.path, "ncclDevCommCreate", api.DevCommCreate);
    bind_symbol(library, api.path, "ncclDevCommDestroy", api.DevCommDestroy);
    bind_symbol(library, api.path, "ncclSend", api.Send);
    bind_symbol(library, api.path, "ncclRecv", api.Recv);
    bind_symbol(library, api.path, "ncclGroupStart", api.GroupStart);
    bind_symbol(library, api.path, "ncclGroupEnd", api.GroupEnd);
    PMOE_CHECK(api.GetVersion(&api.version) == ncclSuccess, "GIN remote path: ncclGetVersion of ",
               api.path, " failed");
    const std::string mismatch = nccl_release_mismatch(NCCL_VERSION_CODE, api.version);
    PMOE_CHECK(mismatch.empty(), "GIN remote path: ", api.path, ": ", mismatch);
  } catch (...) {
    dlclose(library);  // a library refused is not kept
    throw;
  }
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
