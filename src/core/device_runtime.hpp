// What the host code needs from a device runtime, without CUDA headers: memory, copies, streams,
// events, graphs. Which backend an op runs on is not the runtime's business:
// src/backends/registry.hpp picks it, by the runtime's kind().
//
// pmoe's CUDA sources are compiled twice (src/cuda/flavor.hpp): by nvcc for a real GPU, and by
// the host compiler for the emulated device (src/cuda/emulator). Each compilation provides one
// DeviceRuntime; the free functions below forward to the one chosen for this process:
//   PMOE_CUDA_EMULATE=1  the emulated device, even where a GPU is visible;
//   PMOE_CUDA_EMULATE=0  the GPU runtime only (no devices where none is visible);
//   unset                the GPU runtime where the build has it and a GPU is visible, else the
//                        emulated device.
// A build with neither throws pmoe::Error from every call that needs a device.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "pmoe/stream.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe::detail {

constexpr size_t kIpcHandleBytes = 64;

// Device memory in use, for pmoe-bench (DeviceRuntime::memory_use).
struct DeviceMemoryUse {
  size_t in_use = 0, peak = 0;
};

// Which compilation of src/cuda a runtime is (src/cuda/flavor.hpp): nvcc's for a GPU, or the host
// compiler's for the emulated device.
enum class RuntimeKind { gpu, emulated };

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual RuntimeKind kind() const = 0;
  virtual const char* name() const = 0;  // "CUDA" or "emulated CUDA", for messages
  virtual int device_count() const = 0;
  // The device's model as CUDA names it ("NVIDIA H200"); "emulated CUDA device" on the emulated
  // device. For the benchmark's machine record.
  virtual std::string device_name(Device device) const = 0;
  virtual void set_device(Device device) const = 0;
  virtual void* alloc(Device device, size_t bytes) const = 0;  // zeroed
  virtual void free(void* p) const = 0;                           // never throws
  virtual void copy(void* dst, const void* src, size_t bytes) const = 0;
  virtual Stream create_stream(Device device) const = 0;
  virtual void destroy_stream(Stream stream) const = 0;  // never throws
  virtual void synchronize(Stream stream) const = 0;
  virtual void ipc_handle(void* p, void* handle_out) const = 0;
  virtual void* ipc_open(Device device, const void* handle) const = 0;
  virtual void ipc_close(void* p) const = 0;  // never throws
  virtual void ipc_opened_by_all(void* p) const = 0;  // never throws
  // Timing on a stream, for pmoe-bench: events recorded in stream order.
  virtual void* create_event() const = 0;
  virtual void destroy_event(void* event) const = 0;
  virtual void record_event(void* event, Stream stream) const = 0;
  virtual double elapsed_ms(void* start, void* stop) const = 0;  // waits for stop
  virtual void copy_async(void* dst, const void* src, size_t bytes, Stream stream) const = 0;
  // Device memory in use on `device`. The emulated device: its allocator's bytes now, and the
  // most since reset_memory_peak(). CUDA keeps no peak: both are cudaMemGetInfo's total - free,
  // the whole device's use (other processes' too), so a caller samples it where use is highest.
  virtual DeviceMemoryUse memory_use(Device device) const = 0;
  virtual void reset_memory_peak(Device device) const = 0;  // nothing to reset on CUDA
  // CUDA graphs, for pmoe::CudaGraph (include/pmoe/graph.hpp). capture_graph records what `work`
  // enqueues on `stream` in thread-local capture mode, so that the other ranks' threads sharing
  // the device keep launching and synchronising meanwhile, and returns the instantiated graph (a
  // cudaGraphExec_t). A failed CUDA call, or an exception from `work`, ends the capture, leaves
  // the stream usable and throws.
  virtual void* capture_graph(Stream stream, const std::function<void()>& work) const = 0;
  virtual void launch_graph(void* graph, Stream stream) const = 0;  // enqueues one replay
  virtual void destroy_graph(void* graph) const = 0;                // never throws
};

// The runtime chosen for this process (see above); throws pmoe::Error in a build without one.
const DeviceRuntime& device_runtime();

// CUDA_DEVICE_MAX_CONNECTIONS, the hardware queues a device's streams are spread over (8 when
// unset; pmoe sets 32 where it is unset before its first CUDA call). Streams beyond it share a
// queue, and a kernel then waits behind the one before it on the other stream.
int device_max_connections();
// The streams pmoe made on `device` in this process and has not destroyed yet.
int streams_on(Device device);

void* device_alloc(Device device, size_t bytes);  // zeroed
void device_free(Device device, void* p);
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void set_device(Device device);                   // for the calling thread
Stream create_stream(Device device);
void destroy_stream(Stream stream);

// CUDA IPC: a handle that another process on the node opens to map `p` (from device_alloc).
void ipc_handle(void* p, void* handle_out);          // writes kIpcHandleBytes
void* ipc_open(Device device, const void* handle);   // the peer's memory, mapped here
void ipc_close(void* p);                             // never throws
// Every peer has opened p's handle: the emulated device drops the name its handle gave p in
// /dev/shm, so that a process that dies before device_free leaves nothing behind (as the CPU
// segments' names are dropped once mapped). CUDA has nothing to drop. Never throws.
void ipc_opened_by_all(void* p);

}  // namespace pmoe::detail
