// Chooses the device runtime for this process and forwards the host code's device calls to it.
#include "core/device_runtime.hpp"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>

#include "pmoe/error.hpp"

namespace pmoe::detail {

// Defined by the two compilations of src/cuda (src/cuda/device_runtime.cu), where built.
#if PMOE_HAVE_CUDA_GPU
namespace gpu {
const DeviceRuntime& device_runtime();
}
#endif
#if PMOE_HAVE_CUDA_EMULATOR
namespace emulated {
const DeviceRuntime& device_runtime();
}
#endif

namespace {

const DeviceRuntime* choose() {
  // Before CUDA starts, if the caller has not chosen: enough hardware queues that ranks sharing a
  // device never share one (see device_max_connections). No effect once CUDA has started.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  const char* setting = std::getenv("PMOE_CUDA_EMULATE");
  const std::string_view emulate = setting ? setting : "";
#if PMOE_HAVE_CUDA_EMULATOR
  if (emulate == "1") return &emulated::device_runtime();
#endif
#if PMOE_HAVE_CUDA_GPU
  if (emulate == "0" || gpu::device_runtime().device_count() > 0) return &gpu::device_runtime();
#endif
#if PMOE_HAVE_CUDA_EMULATOR
  if (emulate != "0") return &emulated::device_runtime();
#endif
  return nullptr;
}

const DeviceRuntime* chosen() {
  static const DeviceRuntime* runtime = choose();
  return runtime;
}

}  // namespace

const DeviceRuntime& device_runtime() {
  const DeviceRuntime* runtime = chosen();
  if (!runtime)
    throw Error(cat("CUDA device requested, but this build of pmoe has no CUDA runtime to run it",
                    PMOE_HAVE_CUDA_EMULATOR ? " (PMOE_CUDA_EMULATE=0 turned the emulated device off)"
                                            : " (configure with PMOE_CUDA=ON or the emulated device)"));
  return *runtime;
}

void* device_alloc(Device device, size_t bytes) { return device_runtime().alloc(device, bytes); }
void device_free(Device, void* p) {
  if (p) device_runtime().free(p);
}
void copy_bytes(void* dst, Device, const void* src, Device, size_t bytes) {
  device_runtime().copy(dst, src, bytes);
}
void set_device(Device device) { device_runtime().set_device(device); }
int device_max_connections() {
  const char* text = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const int value = text ? std::atoi(text) : 0;
  return value > 0 ? value : 8;
}

namespace {
std::mutex streams_mutex;
std::map<void*, Device>& live_streams() {
  static auto* streams = new std::map<void*, Device>;
  return *streams;
}
}  // namespace

int streams_on(Device device) {
  std::lock_guard lock(streams_mutex);
  int count = 0;
  for (const auto& [handle, where] : live_streams()) count += where == device;
  return count;
}

Stream create_stream(Device device) {
  const Stream stream = device_runtime().create_stream(device);
  std::lock_guard lock(streams_mutex);
  live_streams()[stream.handle] = device;
  return stream;
}
void destroy_stream(Stream stream) {
  if (!stream.handle) return;
  {
    std::lock_guard lock(streams_mutex);
    live_streams().erase(stream.handle);
  }
  device_runtime().destroy_stream(stream);
}
void ipc_handle(void* p, void* handle_out) { device_runtime().ipc_handle(p, handle_out); }
void* ipc_open(Device device, const void* handle) { return device_runtime().ipc_open(device, handle); }
void ipc_opened_by_all(void* p) {
  if (p) device_runtime().ipc_opened_by_all(p);
}
void ipc_close(void* p) {
  if (p) device_runtime().ipc_close(p);
}

}  // namespace pmoe::detail

namespace pmoe {

bool cuda_available_in_build() { return PMOE_HAVE_CUDA_GPU || PMOE_HAVE_CUDA_EMULATOR; }
int cuda_device_count() {
  const detail::DeviceRuntime* runtime = detail::chosen();
  return runtime ? runtime->device_count() : 0;
}
bool cuda_emulated() {
  const detail::DeviceRuntime* runtime = detail::chosen();
  return runtime && runtime->kind() == detail::RuntimeKind::emulated;
}
void synchronize(Stream stream) {
  if (stream.handle) detail::device_runtime().synchronize(stream);
}

}  // namespace pmoe
