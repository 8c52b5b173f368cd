// The host side of the remote path, per flavour (the one place that branches on it, as
// remote_path.cuh does for the device side): builds the RemotePath that a rank's kernels carry
// when some peers have no load/store pointer, the baselines of this rank's remote signals, and its
// traffic counters.
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
#include "cuda/transport/signal_baseline.cuh"
#include "cuda/transport/transport_state.cuh"
#include "pmoe/all_to_all.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#if defined(__CUDACC__)
#include "cuda/transport/gin_memory.hpp"
#else
#include "cuda/emulator/remote.hpp"
#include "cuda/emulator/schedule.hpp"
#endif

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

class RemoteSetup {
 public:
  // `memory`: this rank's (possibly split) symmetric memory; signal slots `signal_stride` words
  // apart. Where every peer is direct, no path is built and every baseline is 0. Otherwise the
  // baselines of this rank's remote signals are read on `stream` (signal_baseline.cuh): call it
  // before the barrier after which peers may signal this rank.
  RemoteSetup(const SymmetricMemory& memory, size_t signal_stride, cudaStream_t stream) {
    const int slots = memory.signal_slots();
    bool remote = false;
    for (int r = 0; r < memory.size(); ++r) remote = remote || memory.peer(r) == nullptr;
    if (remote) open(memory, signal_stride);
    baseline_ = capture_signal_baselines(path(), slots, stream);
  }
  ~RemoteSetup() {
    if (baseline_) (void)cudaFree(baseline_);
  }
  RemoteSetup(const RemoteSetup&) = delete;
  RemoteSetup& operator=(const RemoteSetup&) = delete;

  RemotePath path() const {
    RemotePath path{};
#if defined(__CUDACC__)
    if (gin_) fill_remote_path(*gin_, path);
#else
    path.proxy = proxy_.get();
    path.gin_signals = gin_signals_;
    path.gin_stride = gin_stride_;
#endif
    return path;
  }

  // Device: [slot] the value each of this rank's remote signals had when the op was built.
  const uint64_t* baseline() const { return baseline_; }

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
  void open(const SymmetricMemory& memory, [[maybe_unused]] size_t signal_stride) {
#if defined(__CUDACC__)
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
    // GIN's own words of this rank's slots, from where NCCL might leave them (not 0): no peer
    // adds before the barrier that ends the op's construction.
    uint64_t* own = all.signal_word(memory.rank(), 0);
    ::pmoe::emu::start_gin_signals(own, signal_stride, memory.signal_slots(), memory.rank());
    gin_signals_ = own + ::pmoe::emu::kGinSignalWord;
    gin_stride_ = signal_stride;
    proxy_ = std::make_unique<::pmoe::emu::RemoteProxy>(memory.rank(), std::move(regions),
                                                        std::move(signals), signal_stride,
                                                        ::pmoe::emu::schedule().seed);
#endif
  }

#if defined(__CUDACC__)
  const NcclGin* gin_ = nullptr;  // owned by the GinMemory, which outlives this
#else
  std::unique_ptr<::pmoe::emu::RemoteProxy> proxy_;
  const uint64_t* gin_signals_ = nullptr;
  size_t gin_stride_ = 0;
#endif
  uint64_t* baseline_ = nullptr;
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
