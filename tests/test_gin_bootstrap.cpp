// Thread ranks (1, 2, 4, 5 of them), CPU only: the host-side steps of the GPU remote path that
// need neither a GPU nor NCCL (src/cuda/transport/gin_bootstrap.hpp): rank 0's NCCL unique id
// handed to every rank over pmoe's Communicator, failures on one rank reaching all, the checks
// of a GIN request, and the window's layout.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/agree_on_step.hpp"
#include "cuda/transport/gin_bootstrap.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"

namespace pmoe::cuda {
namespace {

constexpr size_t kIdBytes = 128;  // sizeof(ncclUniqueId)

std::vector<std::byte> random_id(uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<std::byte> id(kIdBytes);
  for (auto& b : id) b = std::byte(random() & 0xff);
  return id;
}

// Runs fn on W thread ranks and returns each rank's pmoe::Error message ("" if it returned).
std::vector<std::string> errors_per_rank(int W, const std::function<void(Communicator&)>& fn) {
  std::vector<std::string> errors(size_t(W), "");
  run_ranks(W, [&](Communicator& comm) {
    try {
      fn(comm);
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  });
  return errors;
}

TEST(GinBootstrap, EveryRankGetsRootsIdAndOnlyRootMakesIt) {
  for (int W : {1, 2, 5}) {
    for (int root = 0; root < W; root += 2) {
      const auto expected = random_id(uint32_t(17 * W + root));
      std::atomic<int> made{0};
      std::vector<std::vector<std::byte>> got{size_t(W)};
      run_ranks(W, [&](Communicator& comm) {
        got[size_t(comm.rank())] = share_root_id(
            comm, root, kIdBytes,
            [&](std::span<std::byte> id) {
              ++made;
              ASSERT_EQ(id.size(), kIdBytes);
              std::copy(expected.begin(), expected.end(), id.begin());
            },
            "ncclGetUniqueId");
      });
      EXPECT_EQ(made.load(), 1) << "W " << W << " root " << root;
      for (int r = 0; r < W; ++r) EXPECT_EQ(got[size_t(r)], expected) << "rank " << r;
    }
  }
}

TEST(GinBootstrap, RootsFailureReachesEveryRankWithItsMessage) {
  const auto errors = errors_per_rank(4, [](Communicator& comm) {
    share_root_id(
        comm, 2, kIdBytes,
        [](std::span<std::byte>) { throw Error("ncclGetUniqueId(&made) failed: no socket"); },
        "ncclGetUniqueId");
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(errors[size_t(r)].find("ncclGetUniqueId failed on rank 2"), std::string::npos)
        << "rank " << r << ": " << errors[size_t(r)];
    EXPECT_NE(errors[size_t(r)].find("no socket"), std::string::npos) << errors[size_t(r)];
  }
}

TEST(GinBootstrap, RootsLongMessageIsTruncatedNotOverrun) {
  const std::string long_message(5000, 'x');
  const auto errors = errors_per_rank(2, [&](Communicator& comm) {
    share_root_id(
        comm, 0, kIdBytes, [&](std::span<std::byte>) { throw Error(long_message); },
        "ncclGetUniqueId");
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("failed on rank 0, which makes it for every rank: xxx"), std::string::npos)
        << e;
    EXPECT_LT(e.size(), 1000u);
  }
}

TEST(GinBootstrap, ShareRootIdRejectsBadArguments) {
  const auto errors = errors_per_rank(2, [](Communicator& comm) {
    share_root_id(
        comm, 2, kIdBytes, [](std::span<std::byte>) {}, "id");
  });
  for (const auto& e : errors) EXPECT_NE(e.find("root 2 outside [0, 2)"), std::string::npos) << e;
  const auto empty = errors_per_rank(2, [](Communicator& comm) {
    share_root_id(
        comm, 0, 0, [](std::span<std::byte>) {}, "id");
  });
  for (const auto& e : empty) EXPECT_NE(e.find("id_bytes must be positive"), std::string::npos);
}

TEST(GinBootstrap, AgreeOnStepNamesTheLowestFailedRankOnEveryRank) {
  // No failure: every rank returns.
  for (const auto& e : errors_per_rank(4, [](Communicator& comm) {
         detail::agree_on_step(
             comm, [] {}, "loading NCCL");
       }))
    EXPECT_EQ(e, "");
  // Ranks 1 and 3 fail (say, no libnccl on their node): all four name rank 1 and its reason.
  const auto errors = errors_per_rank(4, [](Communicator& comm) {
    detail::agree_on_step(
        comm,
        [&] {
          if (comm.rank() % 2 == 1)
            throw Error("cannot load NCCL on rank " + std::to_string(comm.rank()));
        },
        "GIN remote path: loading NCCL");
  });
  for (int r = 0; r < 4; ++r)
    EXPECT_NE(errors[size_t(r)].find(
                  "GIN remote path: loading NCCL failed on rank 1: cannot load NCCL on rank 1"),
              std::string::npos)
        << "rank " << r << ": " << errors[size_t(r)];
  // An exception without a message is still a failure, not a success.
  const auto silent = errors_per_rank(3, [](Communicator& comm) {
    detail::agree_on_step(
        comm, [&] { if (comm.rank() == 2) throw std::runtime_error(""); }, "GIN step");
  });
  for (const auto& e : silent)
    EXPECT_NE(e.find("GIN step failed on rank 2: (no message)"), std::string::npos) << e;
}

TEST(GinBootstrap, RanksSharingAGpuAreNamedOnEveryRank) {
  for (const auto& e : errors_per_rank(4, [](Communicator& comm) {
         check_distinct_devices(comm, "nodeA:0000:" + std::to_string(comm.rank()) + "0:00.0");
       }))
    EXPECT_EQ(e, "");
  // Four ranks, two nodes, ranks 1 and 3 on the same GPU of nodeB.
  const char* gpus[] = {"nodeA:0000:18:00.0", "nodeB:0000:18:00.0", "nodeA:0000:2a:00.0",
                        "nodeB:0000:18:00.0"};
  const auto errors = errors_per_rank(
      4, [&](Communicator& comm) { check_distinct_devices(comm, gpus[comm.rank()]); });
  for (const auto& e : errors)
    EXPECT_NE(e.find("ranks 1 and 3 are both on nodeB:0000:18:00.0"), std::string::npos) << e;
}

TEST(GinBootstrap, RequestChecksNameTheField) {
  struct Case {
    GinRequest request;
    const char* says;  // nullptr: accepted
  };
  const Case cases[] = {
      {{4096, 8, 2}, nullptr},
      {{1, 1, 1}, nullptr},
      {{0, 8, 2}, "region_bytes must be positive"},
      {{(size_t(1) << 44) + 1, 8, 2}, "exceeds the 16 TiB"},
      {{4096, 0, 2}, "signal_slots must be in [1, 2^24], got 0"},
      {{4096, (1 << 24) + 1, 2}, "signal_slots must be in [1, 2^24]"},
      {{4096, 8, 0}, "ranks_per_node must be in [1, 4], got 0"},
      {{4096, 8, 5}, "ranks_per_node must be in [1, 4], got 5"},
      {{4096, 8, 3}, "ranks_per_node 3 does not divide the 4 ranks"},
      {{4096, 8, 4}, "form one node of 4"},
  };
  for (const Case& c : cases) {
    const auto errors =
        errors_per_rank(4, [&](Communicator& comm) { check_gin_request(comm, c.request); });
    for (const auto& e : errors) {
      if (!c.says) {
        EXPECT_EQ(e, "");
      } else {
        EXPECT_NE(e.find(c.says), std::string::npos)
            << "expected '" << c.says << "', got '" << e << "'";
      }
    }
  }
  // One rank alone is one node: never the remote path.
  const auto alone = errors_per_rank(1, [](Communicator& comm) {
    check_gin_request(comm, {4096, 8, 1});
  });
  EXPECT_NE(alone[0].find("form one node"), std::string::npos) << alone[0];
}

// Whether a CUDA AllToAll opens the GIN path (remote_setup.hpp, alloc_transport_memory): only
// where the config splits the world into nodes, or the ranks span nodes and it does not say how.
TEST(GinBootstrap, GpuRanksPerNodeOpensGinOnlyForASplitWorld) {
  // Thread ranks share one node: no split, or one that covers the world, stays on CUDA IPC.
  for (const auto& e : errors_per_rank(4, [](Communicator& comm) {
         const int here = int(comm.node_ranks().size());
         EXPECT_EQ(here, 4);
         EXPECT_EQ(gpu_ranks_per_node(comm.size(), here, 0), 0);
         EXPECT_EQ(gpu_ranks_per_node(comm.size(), here, 4), 0);
         EXPECT_EQ(gpu_ranks_per_node(comm.size(), here, 2), 2);  // emulated nodes: GIN
         EXPECT_EQ(gpu_ranks_per_node(comm.size(), here, 1), 1);  // each rank its own node
       }))
    EXPECT_EQ(e, "");
  // Two nodes of 8 (an mpirun across nodes): the split given is taken as it is ...
  EXPECT_EQ(gpu_ranks_per_node(16, 8, 8), 8);
  EXPECT_EQ(gpu_ranks_per_node(16, 8, 4), 4);
  // ... and without one, every rank (all see 8 of 16 on their node) refuses, naming the fix.
  try {
    (void)gpu_ranks_per_node(16, 8, 0);
    ADD_FAILURE() << "ranks spanning nodes without ranks_per_node were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only 8 of the 16 ranks share this rank's node"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("set AllToAllConfig::ranks_per_node"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW((void)gpu_ranks_per_node(16, 8, 16), Error);  // "one node" that is not
}

TEST(GinBootstrap, WindowHoldsRegionThenSignalsInWholePages) {
  EXPECT_EQ(gin_signals_offset({100, 3, 1}), 128u);
  EXPECT_EQ(gin_window_bytes({100, 3, 1}), 4096u);
  EXPECT_EQ(gin_signals_offset({4096, 64, 1}), 4096u);
  EXPECT_EQ(gin_window_bytes({4096, 64, 1}), 8192u);
  EXPECT_EQ(gin_window_bytes({4096, 65, 1}), 12288u);
  std::mt19937_64 random(7);
  for (int i = 0; i < 1000; ++i) {
    const GinRequest request{1 + random() % (size_t(1) << 30), 1 + int(random() % 5000), 1};
    const size_t offset = gin_signals_offset(request), window = gin_window_bytes(request);
    const size_t needed = offset + size_t(request.signal_slots) * SymmetricMemory::kSignalBytes;
    EXPECT_EQ(offset % SymmetricMemory::kSignalBytes, 0u);
    EXPECT_GE(offset, request.region_bytes);
    EXPECT_LT(offset, request.region_bytes + SymmetricMemory::kSignalBytes);
    EXPECT_EQ(window % kGinWindowAlign, 0u);
    EXPECT_GE(window, needed);
    EXPECT_LT(window - kGinWindowAlign, needed) << "not the smallest whole number of pages";
  }
}

}  // namespace
}  // namespace pmoe::cuda
