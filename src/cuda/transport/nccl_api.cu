#include "cuda/transport/nccl_api.hpp"

#include "cuda/transport/gin_bootstrap.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

namespace pmoe::cuda {
namespace {

#ifndef PMOE_NCCL_LIBRARY_PATH
#define PMOE_NCCL_LIBRARY_PATH "libnccl.so.2"
#endif

// What a library is loaded for: the GIN path (its release must fit the device API headers) or
// the host API alone (any release of the headers' major).
struct Use {
  const char* who;  // the prefix of every message
  bool gin;
};
const Use kGin{"GIN remote path", true};
const Use kHost{"NCCL host API", false};

std::string mismatch(const Use& use, int library) {
  return use.gin ? nccl_release_mismatch(NCCL_VERSION_CODE, library)
                 : nccl_host_release_mismatch(NCCL_VERSION_CODE, library);
}
// The release a library must be, in words: "2.30" for GIN, "2" for the host API.
std::string wanted(const Use& use) {
  return use.gin ? ::pmoe::detail::cat(NCCL_MAJOR, ".", NCCL_MINOR)
                 : ::pmoe::detail::cat(NCCL_MAJOR);
}

// Not named `bind`: for a std::string argument, ADL would pick std::bind, which binds nothing.
template <typename Fn>
void bind_symbol(void* library, const std::string& path, const Use& use, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  PMOE_CHECK(fn != nullptr, use.who, ": ", path, " has no ", name, " (NCCL ", wanted(use),
             use.gin ? " or later needed)" : " needed)");
}

// The release of a loaded libnccl, 0 where it has no working ncclGetVersion.
int release_of(void* library) {
  int version = 0;
  const auto get = reinterpret_cast<decltype(&ncclGetVersion)>(dlsym(library, "ncclGetVersion"));
  return get && get(&version) == ncclSuccess ? version : 0;
}

// Which libnccl: $PMOE_NCCL_LIBRARY if set; else one already in the process (torch's: sharing it
// saves a second copy and its threads) where it fits `use`; else the one CMake found; else the
// loader's libnccl.so.2. RTLD_LOCAL: a second NCCL in the process keeps to itself.
void* open_library(std::string& path, const Use& use) {
  const char* chosen = std::getenv("PMOE_NCCL_LIBRARY");
  if (chosen && *chosen) {
    path = chosen;
    return dlopen(chosen, RTLD_NOW | RTLD_LOCAL);
  }
  path = "libnccl.so.2";
  if (void* loaded = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
    if (mismatch(use, release_of(loaded)).empty()) return loaded;
    dlclose(loaded);  // another release (a 2.28 build beside torch's 2.30): load pmoe's own
  }
  path = PMOE_NCCL_LIBRARY_PATH;
  if (void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return library;
  path = "libnccl.so.2";  // the baked-in path is gone: try the loader's path
  return dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
}

void bind_host(void* library, const Use& use, NcclHostApi& api) {
  bind_symbol(library, api.path, use, "ncclGetVersion", api.GetVersion);
  bind_symbol(library, api.path, use, "ncclGetErrorString", api.GetErrorString);
  bind_symbol(library, api.path, use, "ncclGetLastError", api.GetLastError);
  bind_symbol(library, api.path, use, "ncclGetUniqueId", api.GetUniqueId);
  bind_symbol(library, api.path, use, "ncclCommInitRank", api.CommInitRank);
  bind_symbol(library, api.path, use, "ncclCommFinalize", api.CommFinalize);
  bind_symbol(library, api.path, use, "ncclCommDestroy", api.CommDestroy);
  bind_symbol(library, api.path, use, "ncclSend", api.Send);
  bind_symbol(library, api.path, use, "ncclRecv", api.Recv);
  bind_symbol(library, api.path, use, "ncclGroupStart", api.GroupStart);
  bind_symbol(library, api.path, use, "ncclGroupEnd", api.GroupEnd);
}

void bind_device(void* library, const Use& use, NcclApi& api) {
  bind_symbol(library, api.path, use, "ncclMemAlloc", api.MemAlloc);
  bind_symbol(library, api.path, use, "ncclMemFree", api.MemFree);
  bind_symbol(library, api.path, use, "ncclCommWindowRegister", api.CommWindowRegister);
  bind_symbol(library, api.path, use, "ncclCommWindowDeregister", api.CommWindowDeregister);
  bind_symbol(library, api.path, use, "ncclDevCommCreate", api.DevCommCreate);
  bind_symbol(library, api.path, use, "ncclDevCommDestroy", api.DevCommDestroy);
}

// Loads a library fit for `use` and binds what Api holds (NcclApi: the device API's host side
// too). A library refused is not kept.
template <typename Api>
Api load(const Use& use) {
  Api api;
  void* library = open_library(api.path, use);
  PMOE_CHECK(library != nullptr, use.who, ": cannot load NCCL (", api.path, "): ", dlerror(),
             "; set PMOE_NCCL_LIBRARY to libnccl.so.2 of NCCL ", wanted(use));
  try {
    bind_host(library, use, api);
    if constexpr (std::is_same_v<Api, NcclApi>) bind_device(library, use, api);
    PMOE_CHECK(api.GetVersion(&api.version) == ncclSuccess, use.who, ": ncclGetVersion of ",
               api.path, " failed");
    const std::string why = mismatch(use, api.version);
    PMOE_CHECK(why.empty(), use.who, ": ", api.path, ": ", why);
  } catch (...) {
    dlclose(library);
    throw;
  }
  return api;  // the library stays loaded for the life of the process
}

std::mutex gin_mutex;
std::unique_ptr<NcclApi> gin_api;  // nccl_api()'s, once loaded

}  // namespace

std::string nccl_host_release_mismatch(int headers, int library) {
  if (library / 10000 == headers / 10000) return "";
  return ::pmoe::detail::cat("pmoe was built with NCCL ", headers / 10000,
                             "'s headers, but this libnccl is ", library / 10000, ".",
                             library / 100 % 100, ".", library % 100,
                             " (NCCL's host API is stable within a major release only)");
}

const NcclApi& nccl_api() {
  std::lock_guard lock(gin_mutex);
  // A failure is not remembered: the next call tries again.
  if (!gin_api) gin_api = std::make_unique<NcclApi>(load<NcclApi>(kGin));
  return *gin_api;
}

const NcclHostApi& nccl_host_api() {
  {
    std::lock_guard lock(gin_mutex);
    if (gin_api) return *gin_api;  // one NCCL for both, where the GIN path has loaded one
  }
  static std::mutex mutex;
  static std::unique_ptr<NcclHostApi> api;
  std::lock_guard lock(mutex);
  if (!api) api = std::make_unique<NcclHostApi>(load<NcclHostApi>(kHost));
  return *api;
}

}  // namespace pmoe::cuda
