// The host side of the remote path, per flavour (the one place that branches on it, as
// remote_path.cuh does for the device side): builds the RemotePath that a rank's kernels carry
// when some peers have no load/store pointer, and reads its traffic counters.
//   emulated device: a RemoteProxy (src/cuda/emulator/remote.hpp) over the pointers this machine
//                    maps, which the node split hid from the kernels
//   nvcc:            NCCL GIN (src/cuda/transport/nccl_gin.*): the memory is NCCL's window
//                    (gin_memory.hpp), made by alloc_transport_memory() below; a build without
//                    NCCL's device API refuses there, on every rank, before anything moves
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/node_split.hpp"
#include "cuda/flavor.hpp"
#include "cuda/transport/transport_state.cuh"
#include "pmoe/all_to_all.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#if defined(__CUDACC__)
#include "cuda/transport/gin_memory.hpp"
#else
#include "cuda/emulator/remote.hpp"
#endif

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

class RemoteSetup {
 public:
  // `memory`: this rank's (possibly split) symmetric memory; signal slots `signal_stride` words
  // apart. Nothing is built where every peer is direct.
  RemoteSetup(const SymmetricMemory& memory, size_t signal_stride) {
    bool remote = false;
    for (int r = 0; r < memory.size(); ++r) remote = remote || memory.peer(r) == nullptr;
    if (!remote) return;
#if defined(__CUDACC__)
    (void)signal_stride;
    const auto* gin = dynamic_cast<const GinMemory*>(&memory);
    PMOE_CHECK(gin != nullptr, "AllToAll on CUDA: a peer with no load/store pointer outside "
               "NCCL's window (alloc_transport_memory) cannot be reached");
    gin_ = &gin->gin();
#else
    const auto* split = dynamic_cast<const ::pmoe::detail::NodeSplitMemory*>(&memory);
    PMOE_CHECK(split != nullptr, "AllToAll on the emulated device: a peer with no load/store "
               "pointer outside a ranks_per_node split cannot be reached");
    const SymmetricMemory& all = split->unsplit();
    std::vector<std::byte*> regions;
    std::vector<uint64_t*> signals;
    for (int r = 0; r < all.size(); ++r) {
      PMOE_CHECK(all.peer(r) != nullptr, "AllToAll on the emulated device: rank ", r,
                 " is not mapped on this machine; the emulated remote path reaches only ranks "
                 "that this machine maps");
      regions.push_back(all.peer(r));
      signals.push_back(all.signal_word(r, 0));
    }
    proxy_ = std::make_unique<::pmoe::emu::RemoteProxy>(memory.rank(), std::move(regions),
                                                        std::move(signals), signal_stride,
                                                        memory.signal_slots());
#endif
  }

  RemotePath path() const {
    RemotePath path{};
#if defined(__CUDACC__)
    if (gin_) fill_remote_path(*gin_, path);
#else
    path.proxy = proxy_.get();
#endif
    return path;
  }

  // What this rank has put to remote peers so far.
  AllToAll::RemoteTraffic traffic() const {
#if !defined(__CUDACC__)
    if (proxy_) {
      const auto c = proxy_->counters();
      return {c.bytes, c.transfers};
    }
#endif
    return {};
  }

 private:
#if defined(__CUDACC__)
  const NcclGin* gin_ = nullptr;  // owned by the GinMemory, which outlives this
#else
  std::unique_ptr<::pmoe::emu::RemoteProxy> proxy_;
#endif
};

// Collective: this rank's symmetric memory for an op of `bytes` and `signal_slots` whose ranks
// may be split into nodes (`ranks_per_node`, AllToAllConfig's: 0 = no split). Peers on other
// nodes have no load/store pointer; RemoteSetup reaches them.
//   emulated device: alloc_symmetric, split into nodes (every rank this machine maps stays
//                    reachable for the proxy)
//   nvcc:            alloc_symmetric where every rank is on one node, else NCCL's window
//                    (GinMemory), kernels on `stream`
inline std::unique_ptr<SymmetricMemory> alloc_transport_memory(Communicator& comm, size_t bytes,
                                                               int signal_slots,
                                                               int ranks_per_node,
                                                               [[maybe_unused]] cudaStream_t stream) {
#if defined(__CUDACC__)
  const int per_node =
      gpu_ranks_per_node(comm.size(), int(comm.node_ranks().size()), ranks_per_node);
  if (per_node > 0) return GinMemory::open(comm, {bytes, signal_slots, per_node}, stream);
  return comm.alloc_symmetric(bytes, signal_slots);
#else
  return ::pmoe::detail::split_into_nodes(comm.alloc_symmetric(bytes, signal_slots),
                                          ranks_per_node);
#endif
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
