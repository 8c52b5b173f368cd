// Device symmetric memory over CUDA IPC, for the communicators whose ranks are processes.
#include "comm/device_segments.hpp"

#include "core/device_runtime.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {

DeviceSegments::~DeviceSegments() {
  for (void* p : peer_mappings) ipc_close(p);
  if (own) device_free(device, own);
}

void map_device_segments(DeviceSegments& segments, std::vector<std::byte*>& data, size_t total,
                         Communicator& comm, const std::vector<int>& node_ranks,
                         const std::function<void(const std::string&, const char*)>& agree) {
  const Device device = comm.device();
  const int rank = comm.rank();
  // node_ranks is the same size on every rank of a job that is on one node, or not: every rank
  // throws here alike, before any collective step.
  PMOE_CHECK(node_ranks.size() == size_t(comm.size()), "alloc_symmetric on ", device.str(),
             ": CUDA IPC reaches the ranks of this node only, and ",
             comm.size() - int(node_ranks.size()), " rank(s) are elsewhere (an op across nodes "
             "takes the GIN path, which needs AllToAllConfig::ranks_per_node)");
  segments.device = device;
  std::string error;
  char handle[kIpcHandleBytes] = {};
  try {
    segments.own = device_alloc(device, total);
    data[size_t(rank)] = static_cast<std::byte*>(segments.own);
    ipc_handle(segments.own, handle);
  } catch (const Error& e) {
    error = e.what();
  }
  agree(error, "cudaMalloc and IPC handle");
  const auto handles = comm.all_gather(std::as_bytes(std::span(handle)));
  for (int r : node_ranks) {
    if (r == rank) continue;
    try {
      void* p = ipc_open(device, handles.data() + size_t(r) * sizeof handle);
      segments.peer_mappings.push_back(p);
      data[size_t(r)] = static_cast<std::byte*>(p);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  agree(error, "IPC open");
  ipc_opened_by_all(segments.own);  // every peer has mapped it: drop the name
}

}  // namespace pmoe::detail
