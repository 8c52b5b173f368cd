// The device runtime over the CUDA runtime API (src/core/device_runtime.hpp): memory, copies,
// streams, events, graphs, IPC. Compiled twice (src/cuda/flavor.hpp): by nvcc against CUDA's
// runtime and by the host compiler against the emulated device's.
#include <cstring>
#include <functional>

#include "core/device_runtime.hpp"
#include "cuda/check.hpp"
#include "cuda/flavor.hpp"

namespace pmoe::detail::inline PMOE_CUDA_FLAVOR {

namespace {

static_assert(sizeof(cudaIpcMemHandle_t) <= kIpcHandleBytes, "IPC handle does not fit");

class CudaRuntime final : public DeviceRuntime {
 public:
#if defined(__CUDACC__)
  RuntimeKind kind() const override { return RuntimeKind::gpu; }
  const char* name() const override { return "CUDA"; }
#else
  RuntimeKind kind() const override { return RuntimeKind::emulated; }
  const char* name() const override { return "emulated CUDA"; }
#endif

  int device_count() const override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver or no device: not an error for the caller
      return 0;
    }
    return count;
  }

#if defined(__CUDACC__)
  std::string device_name(Device device) const override {
    PMOE_CHECK(device.kind == Device::Kind::cuda, "device_name: ", device.str(), " is not CUDA");
    cudaDeviceProp properties{};
    PMOE_CUDA_CHECK(cudaGetDeviceProperties(&properties, device.index));
    return properties.name;
  }
#else
  std::string device_name(Device) const override { return "emulated CUDA device"; }
#endif

  void set_device(Device device) const override {
    PMOE_CHECK(device.kind == Device::Kind::cuda, "set_device: ", device.str(), " is not CUDA");
    PMOE_CUDA_CHECK(cudaSetDevice(device.index));
  }

  void* alloc(Device device, size_t bytes) const override {
    set_device(device);
    void* p = nullptr;
    PMOE_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 64));
    PMOE_CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 64));
    PMOE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));  // see copy()
    return p;
  }

  void free(void* p) const override { (void)cudaFree(p); }  // never throws: called from destructors

  void copy(void* dst, const void* src, size_t bytes) const override {
    PMOE_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));  // unified addressing
    // From pageable host memory cudaMemcpy may return before the data lands, and it runs on the
    // legacy stream, which the ranks' non-blocking streams do not wait for: finish it here, so a
    // kernel launched next reads the new bytes. (Not cudaDeviceSynchronize: a peer rank's kernel
    // may be spinning on this device until this rank launches its own.)
    PMOE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }

  Stream create_stream(Device device) const override {
    set_device(device);
    cudaStream_t stream;
    PMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return Stream{stream};
  }

  void destroy_stream(Stream stream) const override {
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream.handle));
  }

  void synchronize(Stream stream) const override {
    PMOE_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.handle)));
  }

  void ipc_handle(void* p, void* handle_out) const override {
    cudaIpcMemHandle_t handle;
    PMOE_CUDA_CHECK(cudaIpcGetMemHandle(&handle, p));
    std::memset(handle_out, 0, kIpcHandleBytes);
    std::memcpy(handle_out, &handle, sizeof handle);
  }

  void* ipc_open(Device device, const void* handle_in) const override {
    set_device(device);
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, handle_in, sizeof handle);
    void* p = nullptr;
    PMOE_CUDA_CHECK(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess));
    return p;
  }

  void ipc_close(void* p) const override { (void)cudaIpcCloseMemHandle(p); }

#if defined(__CUDACC__)
  void ipc_opened_by_all(void*) const override {}  // CUDA's handles leave nothing behind
#else
  void ipc_opened_by_all(void* p) const override { ::pmoe::emu::ipc_drop_name(p); }
#endif

  void* create_event() const override {
    cudaEvent_t event;
    PMOE_CUDA_CHECK(cudaEventCreate(&event));
    return event;
  }
  void destroy_event(void* event) const override {
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  void record_event(void* event, Stream stream) const override {
    PMOE_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event),
                                    static_cast<cudaStream_t>(stream.handle)));
  }
  double elapsed_ms(void* start, void* stop) const override {
    PMOE_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop)));
    float ms = 0;
    PMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start),
                                         static_cast<cudaEvent_t>(stop)));
    return ms;
  }
  void copy_async(void* dst, const void* src, size_t bytes, Stream stream) const override {
    PMOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                    static_cast<cudaStream_t>(stream.handle)));
  }

#if defined(__CUDACC__)
  DeviceMemoryUse memory_use(Device device) const override {
    set_device(device);
    size_t free = 0, total = 0;
    PMOE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return {total - free, total - free};
  }
  void reset_memory_peak(Device) const override {}
#else
  DeviceMemoryUse memory_use(Device device) const override {
    const ::pmoe::emu::MemoryUse use = ::pmoe::emu::memory_use(device.index);
    return {use.in_use, use.peak};
  }
  void reset_memory_peak(Device device) const override {
    ::pmoe::emu::reset_memory_peak(device.index);
  }
#endif

  void* capture_graph(Stream stream, const std::function<void()>& work) const override {
    try {
      return capture(static_cast<cudaStream_t>(stream.handle), work);
    } catch (...) {
      (void)cudaGetLastError();  // the failed capture's, which the next launch's check would raise
      throw;
    }
  }
  void launch_graph(void* graph, Stream stream) const override {
    PMOE_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph),
                                    static_cast<cudaStream_t>(stream.handle)));
  }
  void destroy_graph(void* graph) const override {  // a replay in flight still completes
    (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
  }

 private:
  // Thread-local mode: ranks are threads sharing a device, and the global mode would forbid every
  // thread's allocations and synchronisations while one rank captures.
  static cudaGraphExec_t capture(cudaStream_t stream, const std::function<void()>& work) {
    PMOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      work();
    } catch (...) {
      (void)cudaStreamEndCapture(stream, &graph);  // the stream leaves the capture; work's error
      if (graph) (void)cudaGraphDestroy(graph);    // is the one told
      throw;
    }
    PMOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    try {
      PMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    } catch (...) {
      (void)cudaGraphDestroy(graph);
      throw;
    }
    (void)cudaGraphDestroy(graph);  // the executable keeps what it needs
    return exec;
  }
};

}  // namespace

const DeviceRuntime& device_runtime() {
  static const CudaRuntime runtime;
  return runtime;
}

}  // namespace pmoe::detail::inline PMOE_CUDA_FLAVOR
