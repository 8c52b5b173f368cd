// Thread ranks split into nodes (2 nodes x 2 ranks, and bad splits): off-node peers have no
// load/store pointer and are reached through put/signal; a split that does not divide the world
// is an error on every rank before anything moves.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "all_to_all_cases.hpp"
#include "comm/node_split.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"

namespace pmoe::testing {
namespace {

TEST(NodeSplit, OffNodePeersHaveNoPointerAndTakePuts) {
  constexpr int W = 4, kPerNode = 2, kSlot = 0;
  std::atomic<int> bad{0};
  run_ranks(W, [&](Communicator& comm) {
    auto memory = detail::split_into_nodes(comm.alloc_symmetric(64 * W, 1), kPerNode);
    const int me = comm.rank();
    for (int r = 0; r < W; ++r) {
      const bool same_node = r / kPerNode == me / kPerNode;
      if ((memory->peer(r) != nullptr) != same_node) ++bad;
    }
    // Each rank puts its id into slot `me` of every peer's region, then signals.
    const uint64_t word = 0xA11CE000u + uint64_t(me);
    for (int r = 0; r < W; ++r) memory->put(r, 64 * size_t(me), &word, sizeof word);
    comm.barrier();
    const uint64_t mine = me == 0 ? 1 : 0;  // rank 0 signals everybody, the others wait
    if (mine)
      for (int r = 0; r < W; ++r) memory->signal(r, kSlot, 1);
    memory->wait_signal(kSlot, 1, WaitFor{"NodeSplit", 0, "the signal"});
    for (int r = 0; r < W; ++r) {
      uint64_t got = 0;
      std::memcpy(&got, memory->local() + 64 * size_t(r), sizeof got);
      if (got != 0xA11CE000u + uint64_t(r)) ++bad;
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(NodeSplit, ASplitThatDoesNotDivideTheWorldFailsOnEveryRank) {
  constexpr int W = 3;
  std::atomic<int> named{0};
  run_ranks(W, [&](Communicator& comm) {
    AllToAllConfig c = make_config(/*max_tokens=*/4, /*experts=*/3, /*top_k=*/1, /*hidden=*/8);
    c.ranks_per_node = 2;
    try {
      AllToAll op(comm, c);
    } catch (const Error& e) {
      if (std::string(e.what()).find("ranks_per_node (2) must be 0 (no split) or divide the "
                                     "world size (3)") != std::string::npos)
        ++named;
    }
  });
  EXPECT_EQ(named.load(), W);
}

}  // namespace
}  // namespace pmoe::testing
