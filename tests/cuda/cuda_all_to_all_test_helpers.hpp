// What the AllToAll tests on the CUDA backend share: a test's topology (ranks, ranks per node, how
// a split world's nodes are crossed) and how gtest prints it.
#pragma once

#include <ostream>

#include "pmoe/all_to_all.hpp"

namespace pmoe::testing {

// Ranks, and ranks per node (0: one node; otherwise the world as nodes x ranks, off-node peers
// reached through the device transport's remote path only).
struct Topology {
  int ranks, per_node;
  CrossNode cross_node = CrossNode::direct;  // how a split world's nodes are crossed
};
inline void PrintTo(const Topology& t, std::ostream* out) {
  *out << t.ranks << " ranks, " << t.per_node << " per node"
       << (t.cross_node == CrossNode::hierarchical ? ", hierarchical" : "");
}

}  // namespace pmoe::testing
