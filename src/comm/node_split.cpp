// Ranks of one machine as several nodes: see node_split.hpp.
#include "comm/node_split.hpp"

#include <utility>
#include <vector>

#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

std::vector<std::byte*> on_node_data(const SymmetricMemory& m, int ranks_per_node) {
  std::vector<std::byte*> data(size_t(m.size()), nullptr);
  for (int r = 0; r < m.size(); ++r)
    if (r / ranks_per_node == m.rank() / ranks_per_node) data[size_t(r)] = m.peer(r);
  return data;
}

std::vector<uint64_t*> on_node_signals(const SymmetricMemory& m, int ranks_per_node) {
  std::vector<uint64_t*> signals(size_t(m.size()), nullptr);
  for (int r = 0; r < m.size(); ++r)
    if (r / ranks_per_node == m.rank() / ranks_per_node && m.peer(r) != nullptr)
      signals[size_t(r)] = m.signal_word(r, 0);
  return signals;
}

}  // namespace

NodeSplitMemory::NodeSplitMemory(std::unique_ptr<SymmetricMemory> inner, int ranks_per_node)
    : SymmetricMemory(inner->rank_, inner->bytes_, inner->signal_slots_,
                      on_node_data(*inner, ranks_per_node), on_node_signals(*inner, ranks_per_node),
                      nullptr, inner->group_, inner->timeout_s_, inner->device_),
      inner_(std::move(inner)) {
  if (inner_->polled_transport_) set_polled_transport();
}

void NodeSplitMemory::put(int r, size_t offset, const void* src, size_t bytes) {
  if (peer(r) == nullptr) {
    remote_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    remote_transfers_.fetch_add(1, std::memory_order_relaxed);
  }
  inner_->put(r, offset, src, bytes);
}

void NodeSplitMemory::signal(int r, int slot, uint64_t value) {
  if (peer(r) == nullptr) remote_transfers_.fetch_add(1, std::memory_order_relaxed);
  inner_->signal(r, slot, value);
}

std::unique_ptr<SymmetricMemory> split_into_nodes(std::unique_ptr<SymmetricMemory> memory,
                                                  int ranks_per_node) {
  if (ranks_per_node <= 0 || ranks_per_node >= memory->size()) return memory;
  PMOE_CHECK(memory->size() % ranks_per_node == 0, "ranks_per_node (", ranks_per_node,
             ") must divide the world size (", memory->size(), ")");
  return std::make_unique<NodeSplitMemory>(std::move(memory), ranks_per_node);
}

}  // namespace pmoe::detail
