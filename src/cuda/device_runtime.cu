// The device runtime on CUDA: memory, copies and streams for the host code.
#include <cstring>

#include "core/device_runtime.hpp"
#include "cuda/check.hpp"

namespace pmoe {

bool cuda_available_in_build() { return true; }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: not an error for the caller
    return 0;
  }
  return count;
}

namespace detail {

void set_device(Device device) {
  PMOE_CHECK(device.kind == Device::Kind::cuda, "set_device: ", device.str(), " is not CUDA");
  PMOE_CUDA_CHECK(cudaSetDevice(device.index));
}

void* device_alloc(Device device, size_t bytes) {
  set_device(device);
  void* p = nullptr;
  PMOE_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 64));
  PMOE_CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 64));
  PMOE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // see copy_bytes
  return p;
}

void device_free(Device device, void* p) {
  if (p) (void)cudaFree(p);  // never throws: called from destructors
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  PMOE_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));  // unified addressing
  // From pageable host memory cudaMemcpy may return before the data lands, and it runs on the
  // legacy stream, which the ranks' non-blocking streams do not wait for: finish it here, so a
  // kernel launched next reads the new bytes. (Not cudaDeviceSynchronize: a peer rank's kernel
  // may be spinning on this device until this rank launches its own.)
  PMOE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

Stream create_stream(Device device) {
  set_device(device);
  cudaStream_t stream;
  PMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return Stream{stream};
}

void destroy_stream(Stream stream) {
  if (stream.handle) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream.handle));
}

static_assert(sizeof(cudaIpcMemHandle_t) <= kIpcHandleBytes, "IPC handle does not fit");

void ipc_handle(void* p, void* handle_out) {
  cudaIpcMemHandle_t handle;
  PMOE_CUDA_CHECK(cudaIpcGetMemHandle(&handle, p));
  std::memset(handle_out, 0, kIpcHandleBytes);
  std::memcpy(handle_out, &handle, sizeof handle);
}

void* ipc_open(Device device, const void* handle_in) {
  set_device(device);
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, handle_in, sizeof handle);
  void* p = nullptr;
  PMOE_CUDA_CHECK(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess));
  return p;
}

void ipc_close(void* p) {
  if (p) (void)cudaIpcCloseMemHandle(p);
}

}  // namespace detail

void synchronize(Stream stream) {
  PMOE_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.handle)));
}

}  // namespace pmoe
