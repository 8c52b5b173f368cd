// Symmetric memory on a CUDA device for ranks that are processes of one node (MpiCommunicator,
// SocketCommunicator): each rank allocates its region on its GPU and maps every node peer's
// through CUDA IPC (on the emulated device, POSIX shared memory). Peers on other nodes get no
// mapping here: a GPU op that spans nodes takes NCCL's window instead (the GIN path,
// src/cuda/transport/remote_setup.hpp), which never comes through alloc_symmetric.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "pmoe/comm.hpp"

namespace pmoe::detail {

// What one rank's device allocation owns: its own region and its mappings of the peers'. Frees
// and unmaps on destruction.
struct DeviceSegments {
  Device device = Device::cpu();
  void* own = nullptr;
  std::vector<void*> peer_mappings;
  DeviceSegments() = default;
  DeviceSegments(const DeviceSegments&) = delete;
  DeviceSegments& operator=(const DeviceSegments&) = delete;
  ~DeviceSegments();
};

// Collective over `comm` (on comm.device()). Allocates `total` zeroed bytes on this rank's GPU and
// opens every node peer's handle, filling data[r] for r in `node_ranks`. `agree(error, step)` ends
// each step on every rank alike (agree_on_step). Throws pmoe::Error on every rank where a rank is
// off this node (CUDA IPC cannot reach it), or an allocation or mapping failed on any rank.
void map_device_segments(DeviceSegments& segments, std::vector<std::byte*>& data, size_t total,
                         Communicator& comm, const std::vector<int>& node_ranks,
                         const std::function<void(const std::string&, const char*)>& agree);

}  // namespace pmoe::detail
