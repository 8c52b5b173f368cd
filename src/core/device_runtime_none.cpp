// The device runtime of a build without CUDA: every call says so.
#include "core/device_runtime.hpp"
#include "pmoe/error.hpp"

namespace pmoe {

bool cuda_available_in_build() { return false; }
int cuda_device_count() { return 0; }
void synchronize(Stream) {}

namespace detail {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(cat(what, ": this build of pmoe has no CUDA backend (configure with PMOE_CUDA=ON "
                        "on a machine with the CUDA toolkit)"));
}
}  // namespace

void* device_alloc(Device, size_t) { no_cuda("device_alloc"); }
void device_free(Device, void*) {}
void copy_bytes(void*, Device, const void*, Device, size_t) { no_cuda("copy"); }
void set_device(Device) { no_cuda("set_device"); }
Stream create_stream(Device) { no_cuda("create_stream"); }
void destroy_stream(Stream) {}
void ipc_handle(void*, void*) { no_cuda("ipc_handle"); }
void* ipc_open(Device, const void*) { no_cuda("ipc_open"); }
void ipc_close(void*) {}

}  // namespace detail
}  // namespace pmoe
