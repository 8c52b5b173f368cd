// Memory of the emulated CUDA runtime: device memory, host-mapped memory, copies, memsets, IPC.
//
// Device memory is a shared-memory file (an unnamed O_TMPFILE in /dev/shm, or a memfd) mapped
// into the process, so that cudaIpcGetMemHandle can give it a name another process opens. The
// name exists only from the first handle until every peer has opened it (ipc_drop_name) or
// cudaFree. New device memory is filled with 0xcd, not zeros: a kernel that reads what nobody
// wrote sees garbage, as it may on a GPU.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "comm/shm_segment.hpp"
#include "cuda/emulator/host_view.hpp"
#include "cuda/emulator/late_stores.hpp"
#include "cuda/emulator/streams.hpp"
#include "pmoe/error.hpp"

namespace pmoe::emu {

using namespace cuda_api;

namespace {

constexpr size_t kGarbageFillLimit = size_t(256) << 20;  // larger allocations are not filled
constexpr uint32_t kHandleMagic = 0x454f4d50;            // "PMOE"

struct Allocation {
  size_t bytes = 0;     // mapped length
  int device = 0;       // the device it was allocated on (owned allocations)
  int fd = -1;          // the file behind it
  std::string name;     // its /dev/shm name once an IPC handle was made
  bool owned = true;    // false: another process's memory, mapped by cudaIpcOpenMemHandle
};

struct IpcHandle {
  uint32_t magic;
  uint32_t pad;
  uint64_t bytes;
  char name[48];
};
static_assert(sizeof(IpcHandle) <= sizeof(cudaIpcMemHandle_t));

std::mutex mutex;
std::map<uintptr_t, Allocation>& device_allocations() {
  static auto* m = new std::map<uintptr_t, Allocation>;
  return *m;
}
// Owned device memory per device, under `mutex`.
std::map<int, MemoryUse>& memory_uses() {
  static auto* m = new std::map<int, MemoryUse>;
  return *m;
}

std::map<uintptr_t, size_t>& host_allocations() {  // start: bytes
  static auto* m = new std::map<uintptr_t, size_t>;
  return *m;
}

size_t page_rounded(size_t bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

int shared_file() {
  const int fd = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  return fd >= 0 ? fd : memfd_create("pmoe-emu", MFD_CLOEXEC);
}

// True when `p` lies in device memory of this process (its own or a peer's, mapped).
bool is_device(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(mutex);
  auto& all = device_allocations();
  auto it = all.upper_bound(address);
  if (it == all.begin()) return false;
  --it;
  return address < it->first + it->second.bytes;
}

}  // namespace

bool is_host_mapped(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(mutex);
  auto& all = host_allocations();
  auto it = all.upper_bound(address);
  if (it == all.begin()) return false;
  --it;
  return address < it->first + it->second;
}

namespace {

// A copy in stream order. Data from host memory is staged now, as CUDA stages pageable memory,
// so the caller may reuse its buffer at once; a copy to host memory is waited for when `sync`.
cudaError_t copy_in_order(void* dst, const void* src, size_t bytes, cudaStream_t stream, bool sync) {
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src) return cudaErrorInvalidValue;
  const bool to_host = !is_device(dst), from_host = !is_device(src);
  cudaError_t status;
  if (from_host) {
    auto staged = std::make_shared<std::vector<std::byte>>(static_cast<const std::byte*>(src),
                                                           static_cast<const std::byte*>(src) + bytes);
    status = enqueue(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  } else {
    status = enqueue(stream, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }
  if (status == cudaSuccess && sync && to_host) status = wait_stream(stream);
  return status;
}

cudaError_t set_in_order(void* p, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!is_device(p) || !is_device(static_cast<std::byte*>(p) + bytes - 1))
    return cudaErrorInvalidValue;
  return enqueue(stream, [p, value, bytes] { std::memset(p, value, bytes); });
}

}  // namespace

namespace cuda_api {

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  const size_t mapped = page_rounded(bytes);
  const int fd = shared_file();
  if (fd < 0) return note_error(cudaErrorMemoryAllocation);
  // posix_fallocate fails cleanly where a full /dev/shm would fault on first touch.
  if (posix_fallocate(fd, 0, off_t(mapped)) != 0) {
    close(fd);
    return note_error(cudaErrorMemoryAllocation);
  }
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return note_error(cudaErrorMemoryAllocation);
  }
  if (mapped <= kGarbageFillLimit) std::memset(p, 0xcd, mapped);
  const int device = current_device();
  std::lock_guard lock(mutex);
  device_allocations()[reinterpret_cast<uintptr_t>(p)] = Allocation{mapped, device, fd, {}, true};
  MemoryUse& use = memory_uses()[device];
  use.in_use += mapped;
  use.peak = std::max(use.peak, use.in_use);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  Allocation allocation;
  {
    std::lock_guard lock(mutex);
    auto it = device_allocations().find(reinterpret_cast<uintptr_t>(ptr));
    if (it == device_allocations().end() || !it->second.owned)
      return note_error(cudaErrorInvalidDevicePointer);
    allocation = it->second;
  }
  wait_device(current_device());  // as CUDA's cudaFree: the device finishes first
  {
    std::lock_guard lock(mutex);
    device_allocations().erase(reinterpret_cast<uintptr_t>(ptr));
    memory_uses()[allocation.device].in_use -= allocation.bytes;
  }
  if (!allocation.name.empty()) shm_unlink(allocation.name.c_str());
  munmap(ptr, allocation.bytes);
  close(allocation.fd);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned) {
  // Page-locking may synchronise the device on CUDA; here it always does, so code that allocates
  // while a peer's kernel waits for it deadlocks here as it can there.
  wait_device(current_device());
  *ptr = std::aligned_alloc(4096, page_rounded(bytes ? bytes : 1));
  if (!*ptr) return note_error(cudaErrorMemoryAllocation);
  std::lock_guard lock(mutex);
  host_allocations().emplace(reinterpret_cast<uintptr_t>(*ptr), bytes);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, 0); }

cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  {
    std::lock_guard lock(mutex);
    if (!host_allocations().erase(reinterpret_cast<uintptr_t>(ptr)))
      return note_error(cudaErrorInvalidValue);
  }
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void** device_ptr, void* host_ptr, unsigned) {
  std::lock_guard lock(mutex);
  if (!host_allocations().count(reinterpret_cast<uintptr_t>(host_ptr)))
    return note_error(cudaErrorInvalidValue);
  *device_ptr = host_ptr;  // host-mapped memory is host memory here
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  return note_error(copy_in_order(dst, src, bytes, cudaStreamLegacy, true));
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t stream) {
  return note_error(copy_in_order(dst, src, bytes, stream, false));
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  return note_error(set_in_order(ptr, value, bytes, cudaStreamLegacy));
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  return note_error(set_in_order(ptr, value, bytes, stream));
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* ptr) {
  std::lock_guard lock(mutex);
  auto it = device_allocations().find(reinterpret_cast<uintptr_t>(ptr));
  if (it == device_allocations().end() || !it->second.owned)
    return note_error(cudaErrorInvalidDevicePointer);
  Allocation& a = it->second;
  if (a.name.empty()) {
    // A name nobody can guess, made only now, linked to the file the memory already lives in.
    std::random_device entropy;
    char name[sizeof IpcHandle{}.name];
    // Under the shared-memory prefix (PMOE_SHM_PREFIX), so that tests find any left behind. The
    // name travels in the 64-byte handle: "/" prefix ".emu." 16 hex digits and a NUL must fit.
    const unsigned high = entropy(), low = entropy();
    const std::string prefix = pmoe::detail::shm_prefix();
    constexpr size_t kMaxPrefix = sizeof IpcHandle{}.name - 23;
    PMOE_CHECK(prefix.size() <= kMaxPrefix, "PMOE_SHM_PREFIX '", prefix, "' is ", prefix.size(),
               " characters; the emulated CUDA device's IPC names (in a 64-byte "
               "cudaIpcMemHandle_t) fit a prefix of at most ", kMaxPrefix);
    std::snprintf(name, sizeof name, "/%s.emu.%08x%08x", prefix.c_str(), high, low);
    const std::string from = "/proc/self/fd/" + std::to_string(a.fd);
    const std::string to = std::string("/dev/shm") + name;
    if (linkat(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), AT_SYMLINK_FOLLOW) != 0)
      return note_error(cudaErrorNotSupported);  // a memfd cannot be linked: no IPC from here
    a.name = name;
  }
  ::pmoe::emu::late_stores_shared_across_processes();  // the peer that acquires may be in another process
  IpcHandle h{};
  h.magic = kHandleMagic;
  h.bytes = a.bytes;
  std::snprintf(h.name, sizeof h.name, "%s", a.name.c_str());
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle, &h, sizeof h);
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** ptr, cudaIpcMemHandle_t handle, unsigned) {
  IpcHandle h;
  std::memcpy(&h, &handle, sizeof h);
  if (h.magic != kHandleMagic) return note_error(cudaErrorInvalidValue);
  ::pmoe::emu::late_stores_shared_across_processes();
  h.name[sizeof h.name - 1] = 0;
  const int fd = shm_open(h.name, O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return note_error(cudaErrorInvalidValue);
  void* p = mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return note_error(cudaErrorMemoryAllocation);
  }
  std::lock_guard lock(mutex);
  device_allocations()[reinterpret_cast<uintptr_t>(p)] = Allocation{h.bytes, 0, fd, {}, false};
  *ptr = p;
  return cudaSuccess;
}

}  // namespace cuda_api

MemoryUse memory_use(int device) {
  std::lock_guard lock(mutex);
  return memory_uses()[device];
}

void reset_memory_peak(int device) {
  std::lock_guard lock(mutex);
  MemoryUse& use = memory_uses()[device];
  use.peak = use.in_use;
}

void ipc_drop_name(void* ptr) {
  std::lock_guard lock(mutex);
  auto it = device_allocations().find(reinterpret_cast<uintptr_t>(ptr));
  if (it == device_allocations().end() || it->second.name.empty()) return;
  shm_unlink(it->second.name.c_str());
  it->second.name.clear();
}

namespace cuda_api {

cudaError_t cudaIpcCloseMemHandle(void* ptr) {
  Allocation allocation;
  {
    std::lock_guard lock(mutex);
    auto it = device_allocations().find(reinterpret_cast<uintptr_t>(ptr));
    if (it == device_allocations().end() || it->second.owned)
      return note_error(cudaErrorInvalidDevicePointer);
    allocation = it->second;
    device_allocations().erase(it);
  }
  munmap(ptr, allocation.bytes);
  close(allocation.fd);
  return cudaSuccess;
}

}  // namespace cuda_api
}  // namespace pmoe::emu
