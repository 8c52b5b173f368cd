// Devices and errors of the emulated CUDA runtime: the calling thread's device, the devices'
// count and attributes (grid.hpp's DeviceShape), a device-wide wait, and the calling thread's last
// error with CUDA's name and message for each code.
#include <utility>

#include "cuda/emulator/grid.hpp"
#include "cuda/emulator/stream_objects.hpp"

namespace pmoe::emu {

using namespace cuda_api;

thread_local int this_device = 0;

namespace {
thread_local cudaError_t last_error = cudaSuccess;
}  // namespace

int current_device() { return this_device; }

cudaError_t note_error(cudaError_t error) {
  if (error != cudaSuccess) last_error = error;
  return error;
}

namespace cuda_api {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_shape().devices;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_shape().devices) return note_error(cudaErrorInvalidDevice);
  this_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = this_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  if (captures_on_this_thread > 0) return note_error(cudaErrorStreamCaptureUnsupported);
  ++host_syncs;
  wait_device(this_device);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= device_shape().devices) return note_error(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = device_shape().sms; return cudaSuccess;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = device_shape().blocks_per_sm; return cudaSuccess;
  }
  return note_error(cudaErrorInvalidValue);
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*, int block_threads,
                                                          size_t) {
  if (block_threads <= 0 || block_threads > 1024) return note_error(cudaErrorInvalidValue);
  *blocks = device_shape().blocks_per_sm;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() { return std::exchange(last_error, cudaSuccess); }
cudaError_t cudaPeekAtLastError() { return last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorUnknown: return "cudaErrorUnknown";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorStreamCaptureUnmatched: return "the capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined: return "the capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorUnknown: return "unknown error";
  }
  return "unknown error";
}

}  // namespace cuda_api
}  // namespace pmoe::emu
