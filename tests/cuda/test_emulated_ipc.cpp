// One process, the emulated CUDA device's runtime called directly: the names its IPC handles give
// device memory in /dev/shm (src/cuda/emulator/memory.cpp). Emulator only: CUDA has no such names.
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <dirent.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "pmoe/error.hpp"

namespace pmoe {
namespace {

// Sets PMOE_SHM_PREFIX for one scope.
class ScopedPrefix {
 public:
  explicit ScopedPrefix(const std::string& value) {
    if (const char* old = std::getenv("PMOE_SHM_PREFIX")) old_ = old, had_ = true;
    setenv("PMOE_SHM_PREFIX", value.c_str(), 1);
  }
  ~ScopedPrefix() {
    had_ ? setenv("PMOE_SHM_PREFIX", old_.c_str(), 1) : unsetenv("PMOE_SHM_PREFIX");
  }

 private:
  std::string old_;
  bool had_ = false;
};

// The names in /dev/shm that start with `prefix`.
std::vector<std::string> shm_names(const std::string& prefix) {
  std::vector<std::string> names;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir))
      if (std::string(entry->d_name).rfind(prefix, 0) == 0) names.push_back(entry->d_name);
    closedir(dir);
  }
  return names;
}

// A prefix unique to this process, `length` characters long.
std::string prefix_of_length(size_t length) {
  std::string prefix = "ipc" + std::to_string(getpid()) + "-";
  prefix.resize(length, 'p');
  return prefix;
}

TEST(EmulatedIpc, NameUsesAPrefixOf25Characters) {
  const std::string prefix = prefix_of_length(25);
  ScopedPrefix scoped(prefix);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
  cudaIpcMemHandle_t handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, p), cudaSuccess);
  EXPECT_EQ(shm_names(prefix + ".emu.").size(), 1u) << "the name is under the full prefix";
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(shm_names(prefix).size(), 0u);
}

TEST(EmulatedIpc, PrefixTooLongForTheHandleIsRefused) {
  const std::string prefix = prefix_of_length(26);
  ScopedPrefix scoped(prefix);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
  cudaIpcMemHandle_t handle;
  try {
    (void)cudaIpcGetMemHandle(&handle, p);
    ADD_FAILURE() << "a 26-character PMOE_SHM_PREFIX was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PMOE_SHM_PREFIX '" + prefix + "' is 26 characters; "
                                         "the emulated CUDA device's IPC names (in a 64-byte "
                                         "cudaIpcMemHandle_t) fit a prefix of at most 25"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(shm_names("pmoe.emu.").size() + shm_names(prefix).size(), 0u)
      << "no name under another prefix either";
  ASSERT_EQ(cudaFree(p), cudaSuccess);
}

TEST(EmulatedIpc, DroppedNameLeavesTheMappingsAndNoLaterHandle) {
  const std::string prefix = prefix_of_length(20);
  ScopedPrefix scoped(prefix);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
  cudaIpcMemHandle_t handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, p), cudaSuccess);
  void* mapped = nullptr;
  ASSERT_EQ(cudaIpcOpenMemHandle(&mapped, handle, cudaIpcMemLazyEnablePeerAccess), cudaSuccess);
  emu::ipc_drop_name(p);
  EXPECT_EQ(shm_names(prefix).size(), 0u) << "the name outlived ipc_drop_name";
  static_cast<int*>(p)[0] = 1234;  // the open mapping still reaches the memory
  EXPECT_EQ(static_cast<int*>(mapped)[0], 1234);
  void* stale = nullptr;
  EXPECT_NE(cudaIpcOpenMemHandle(&stale, handle, 0), cudaSuccess) << "the old name still opens";
  EXPECT_EQ(cudaIpcGetMemHandle(&handle, p), cudaErrorNotSupported) << "no name can be made again";
  (void)cudaGetLastError();
  EXPECT_EQ(shm_names(prefix).size(), 0u);
  EXPECT_EQ(cudaIpcCloseMemHandle(mapped), cudaSuccess);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(shm_names(prefix).size(), 0u);
}

}  // namespace
}  // namespace pmoe
