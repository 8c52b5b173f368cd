// The CUDA runtime API on the emulated device: the calls pmoe makes, with CUDA's signatures, so
// host code written for the CUDA runtime compiles unchanged against it. The names live in
// pmoe::emu::cuda_api and are made visible globally by a using-directive; nothing here clashes
// with the real libcudart, so one library can hold both (src/core/device_backend.hpp).
//
// Semantics kept from CUDA because pmoe's correctness depends on them:
// - streams are in-order queues, each run by its own host thread; the legacy stream is one more
//   queue, which non-blocking streams do not wait for;
// - cudaMemcpy from host memory may return before the copy lands (it is staged first, as CUDA
//   stages pageable memory); cudaMemset and device-to-device copies are asynchronous too;
// - cudaFree waits for every stream of the device, as CUDA's does;
// - a stream under capture records its work instead of running it; a host synchronisation or a
//   legacy-stream call from the capturing thread is an error, as in cudaStreamCaptureModeThreadLocal;
//   other streams join a capture through events, and must be joined back before it ends;
// - cudaGetLastError is per host thread and clears.
// docs/emulated-device.md describes the whole model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace pmoe::emu {

struct StreamImpl;
struct EventImpl;
struct GraphImpl;

namespace cuda_api {

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr operator uint3() const { return {x, y, z}; }
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) int2 {
  int x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnmatched = 903,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
  cudaErrorCapturedEvent = 907,
  cudaErrorNotSupported = 801,
  cudaErrorUnknown = 999,
};
using cudaError_t = cudaError;

using cudaStream_t = StreamImpl*;
using cudaEvent_t = EventImpl*;
using cudaGraph_t = GraphImpl*;
using cudaGraphExec_t = GraphImpl*;

struct cudaIpcMemHandle_t {
  char reserved[64];
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMaxBlocksPerMultiprocessor = 106,
};

constexpr unsigned cudaStreamDefault = 0, cudaStreamNonBlocking = 1;
constexpr unsigned cudaHostAllocDefault = 0, cudaHostAllocPortable = 1, cudaHostAllocMapped = 2;
constexpr unsigned cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2;
constexpr unsigned cudaIpcMemLazyEnablePeerAccess = 1;
inline const cudaStream_t cudaStreamLegacy = reinterpret_cast<cudaStream_t>(uintptr_t{1});
inline const cudaStream_t cudaStreamPerThread = reinterpret_cast<cudaStream_t>(uintptr_t{2});

// Devices and errors.
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);

// Memory.
cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned flags);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaHostGetDevicePointer(void** device_ptr, void* host_ptr, unsigned flags);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream = nullptr);
template <typename T>
cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
template <typename T>
cudaError_t cudaHostAlloc(T** ptr, size_t bytes, unsigned flags) {
  return cudaHostAlloc(reinterpret_cast<void**>(ptr), bytes, flags);
}

// Streams and events.
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

// Graphs: a capture records the work of its origin stream and of every stream that joins it by
// waiting on an event recorded in it (CUDA's cross-stream capture; graphs.cpp); a launch
// replays it on a stream, its branches concurrently.
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

// CUDA IPC: device memory lives in shared-memory files, so another process can map it.
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* ptr);
cudaError_t cudaIpcOpenMemHandle(void** ptr, cudaIpcMemHandle_t handle, unsigned flags);
cudaError_t cudaIpcCloseMemHandle(void* ptr);

// Occupancy: the emulated device's blocks per SM, whatever the kernel.
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* kernel,
                                                          int block_threads, size_t shared_bytes);
template <typename Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel kernel,
                                                          int block_threads, size_t shared_bytes) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      blocks, reinterpret_cast<const void*>(kernel), block_threads, shared_bytes);
}

}  // namespace cuda_api

// Not CUDA: unlinks the /dev/shm name that cudaIpcGetMemHandle gave device memory `ptr`, once
// every peer has opened it; their mappings stay. The file cannot be linked again (O_TMPFILE), so
// a later cudaIpcGetMemHandle on `ptr` fails with cudaErrorNotSupported.
void ipc_drop_name(void* ptr);

// Not CUDA: the emulated allocator's count of device memory on `device` (cudaMalloc's bytes,
// page-rounded, not yet freed), and the most there was since the last reset_memory_peak (or the
// start): what pmoe-bench reports as a layer's device memory. CUDA's allocator keeps no peak.
struct MemoryUse {
  size_t in_use = 0, peak = 0;
};
MemoryUse memory_use(int device);
void reset_memory_peak(int device);  // peak = in_use

// The launch of the emulated device: `body` runs once per thread of every block of `grid`, in
// stream order. What src/cuda/launch.cuh calls where nvcc would use <<<...>>>. `name` (a string
// literal: it outlives the launch) names the kernel in the counts of kernel_counts.hpp.
cuda_api::cudaError_t launch(cuda_api::dim3 grid, cuda_api::dim3 block, size_t shared_bytes,
                             cuda_api::cudaStream_t stream, std::function<void()> body,
                             const char* name = nullptr);

// Called from kernel code through src/cuda/launch.cuh (kernel_counts.hpp).
void count_wait_on_own_grid();
void count_serial_steps(int64_t n);
// Global-memory bytes the calling kernel thread moved (the load and store helpers of
// src/cuda/memory_ops.cuh and launch.cuh), and its fences and release operations of system scope
// (__threadfence_system(), cuda::atomic_ref<.., system> writes that release). Nothing on a host
// thread.
void count_bytes_read(int64_t n);
void count_bytes_written(int64_t n);
void count_system_fence();

// Kernels the calling host thread has launched (or captured into a graph) so far, so that tests
// can count an op's kernels.
uint64_t kernels_launched_by_this_thread();
// Work items the calling host thread has put on streams (kernels, GEMMs, copies, memsets, event
// records and waits; captured ones included), and the times it has waited for a device
// (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize), so that tests can count
// what one call of an op costs.
uint64_t stream_work_by_this_thread();
uint64_t host_syncs_by_this_thread();

// %globaltimer: nanoseconds of a steady clock.
uint64_t global_timer_ns();

}  // namespace pmoe::emu

using namespace pmoe::emu::cuda_api;  // NOLINT: CUDA's names are global in CUDA's own header
