// Ranks of one machine split into several nodes (AllToAllConfig::ranks_per_node), so that thread
// ranks and MPI processes here behave as a multi-node run: a peer on another node of the split
// has no load/store pointer (peer(r) and its signal array are null) and is reached through put()
// and signal() only, which the wrapped memory still carries out (a memcpy for thread ranks, the
// transport for MPI). On a CUDA device, where kernels read the pointers, off-node peers are left
// to the device transport (src/cuda/transport).
//
//   ranks_per_node = 2, W = 4:   node 0 = {0, 1}   node 1 = {2, 3}
//   rank 1's view:               peer(0), peer(1) set; peer(2), peer(3) null
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "pmoe/comm.hpp"

namespace pmoe::detail {

class NodeSplitMemory final : public SymmetricMemory {
 public:
  NodeSplitMemory(std::unique_ptr<SymmetricMemory> inner, int ranks_per_node);

  void put(int r, size_t offset, const void* src, size_t bytes) override;
  void signal(int r, int slot, uint64_t value) override;

  // The wrapped memory, whose pointers still reach every rank this machine maps (for the
  // emulated device's remote proxy, which stands for the network).
  const SymmetricMemory& unsplit() const { return *inner_; }
  // What put() and signal() sent to peers on other nodes: payload bytes, and puts plus signals.
  uint64_t remote_bytes() const { return remote_bytes_.load(std::memory_order_relaxed); }
  uint64_t remote_transfers() const { return remote_transfers_.load(std::memory_order_relaxed); }

 protected:
  void progress() const override { inner_->progress(); }

 private:
  std::unique_ptr<SymmetricMemory> inner_;
  std::atomic<uint64_t> remote_bytes_{0}, remote_transfers_{0};
};

// `memory` with peers outside this rank's node of the split hidden from load/store; `memory`
// itself where ranks_per_node is 0 or the whole world. ranks_per_node must divide the size.
std::unique_ptr<SymmetricMemory> split_into_nodes(std::unique_ptr<SymmetricMemory> memory,
                                                  int ranks_per_node);

}  // namespace pmoe::detail
