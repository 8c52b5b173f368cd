// CudaGraph over the device runtime chosen for this process (core/device_runtime.hpp): one class
// for the GPU and the emulated device, each runtime capturing with its own CUDA calls.
#include "pmoe/graph.hpp"

#include <utility>

#include "core/device_runtime.hpp"
#include "pmoe/error.hpp"

namespace pmoe {

namespace {

// The runtime, or why there is none, said as CudaGraph's error.
const detail::DeviceRuntime& runtime_for_graphs() {
  try {
    return detail::device_runtime();
  } catch (const Error& e) {
    throw Error(detail::cat("CudaGraph: ", e.what()));
  }
}

void* capture(Stream stream, const std::function<void()>& work) {
  PMOE_CHECK(stream.handle,
             "CudaGraph: the null Stream cannot be captured: it is the CPU's (whose "
             "ops run on the calling thread) or the device's legacy stream; capture on a CUDA "
             "stream, e.g. comm.stream() of run_ranks(n, fn, Device::cuda(0))");
  const detail::DeviceRuntime& runtime = runtime_for_graphs();
  try {
    return runtime.capture_graph(stream, work);
  } catch (const Error& e) {
    throw Error(detail::cat("CudaGraph: capture failed: ", e.what()));
  }
}

}  // namespace

CudaGraph::CudaGraph(Stream stream, const std::function<void()>& work)
    : stream_(stream), exec_(capture(stream, work)) {}

CudaGraph::~CudaGraph() {
  if (exec_) detail::device_runtime().destroy_graph(exec_);
}

CudaGraph::CudaGraph(CudaGraph&& other) noexcept
    : stream_(other.stream_), exec_(std::exchange(other.exec_, nullptr)) {}

CudaGraph& CudaGraph::operator=(CudaGraph&& other) noexcept {
  if (this != &other) {
    if (exec_) detail::device_runtime().destroy_graph(exec_);
    stream_ = other.stream_;
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

void CudaGraph::replay() {
  PMOE_CHECK(exec_, "CudaGraph::replay: this graph was moved from");
  detail::device_runtime().launch_graph(exec_, stream_);
}

}  // namespace pmoe
