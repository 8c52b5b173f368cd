// Thread ranks (1, 2, 4, 5 of them), CPU only: the host-side steps of the GPU remote path that
// need neither a GPU nor NCCL (src/cuda/transport/gin_bootstrap.hpp): rank 0's NCCL unique id
// handed to every rank over pmoe's Communicator, failures on one rank reaching all, the checks
// of a GIN request, and the window's layout.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/agree_on_step.hpp"
#include "cuda/transport/gin_bootstrap.hpp"
#include "cuda/transport/shared_nccl_comm.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"

namespace pmoe::cuda {
namespace {

constexpr size_t kIdBytes = 128;  // sizeof(ncclUniqueId)

const char* no_env(const char*) { return nullptr; }
// NCCL 2.28.9's limits with no NCCL_* variable set.
const GinLimits kNccl228 = gin_limits(22809, no_env);

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
        comm,
        [&] {
          if (comm.rank() == 2) throw std::runtime_error("");
        },
        "GIN step");
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
      {{4096, 0, 2}, "signal_slots must be positive, got 0"},
      {{4096, 65536, 2}, nullptr},
      {{4096, 65537, 2},
       "signal_slots 65537 exceed the 65536 GIN signals NCCL gives "
       "(NCCL_GIN_SIGNAL_POOL_SIZE, per NCCL communicator)"},
      {{4096, 8, 2, 0}, "contexts 0 outside the [1, 4]"},
      {{4096, 8, 2, 5},
       "contexts 5 outside the [1, 4] GIN contexts NCCL gives a device "
       "communicator (NCCL_GIN_NCONTEXTS)"},
      {{4096, 8, 0}, "ranks_per_node must be in [1, 4], got 0"},
      {{4096, 8, 5}, "ranks_per_node must be in [1, 4], got 5"},
      {{4096, 8, 3}, "ranks_per_node 3 does not divide the 4 ranks"},
      {{4096, 8, 4}, "form one node of 4"},
  };
  for (const Case& c : cases) {
    const auto errors = errors_per_rank(
        4, [&](Communicator& comm) { check_gin_request(comm, c.request, kNccl228); });
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
    check_gin_request(comm, {4096, 8, 1}, kNccl228);
  });
  EXPECT_NE(alone[0].find("form one node"), std::string::npos) << alone[0];
}

TEST(GinBootstrap, LimitsAreNcclsForItsReleaseAndEnvironment) {
  EXPECT_EQ(kNccl228.signal_pool, 65536);
  EXPECT_TRUE(kNccl228.pool_shared);
  EXPECT_EQ(kNccl228.contexts, 4);
  auto env_of = [](const char* pool, const char* contexts) {
    return [=](const char* name) -> const char* {
      return std::string(name) == "NCCL_GIN_SIGNAL_POOL_SIZE" ? pool
             : std::string(name) == "NCCL_GIN_NCONTEXTS"      ? contexts
                                                              : nullptr;
    };
  };
  const GinLimits set = gin_limits(22809, env_of("1000", "1"));
  EXPECT_EQ(set.signal_pool, 1000);
  EXPECT_EQ(set.contexts, 1);
  // NCCL takes its default back for a pool outside [0, 2^30), and at most 4 contexts.
  EXPECT_EQ(gin_limits(22809, env_of("1073741824", "9")).signal_pool, 65536);
  EXPECT_EQ(gin_limits(22809, env_of("-1", "9")).contexts, 4);
  EXPECT_EQ(gin_limits(22809, env_of("0", "0")).contexts, 0);
  EXPECT_EQ(gin_limits(22907, no_env).signal_pool, 512 << 10) << "2.29.7's default pool";
  EXPECT_TRUE(gin_limits(22907, no_env).pool_shared);
  // 2.30 on: per device communicator, up to the 24-bit signal id, whatever the environment.
  const GinLimits later = gin_limits(23007, env_of("1000", "1"));
  EXPECT_EQ(later.signal_pool, 1 << 24);
  EXPECT_FALSE(later.pool_shared);
  EXPECT_EQ(later.contexts, std::numeric_limits<int>::max()) << "as many as asked";
  EXPECT_EQ(gin_limits(22907, env_of("1000", "1")).contexts, std::numeric_limits<int>::max());
}

// A pool shared by the NCCL communicator counts what the Communicator's other ops hold.
TEST(GinBootstrap, SharedSignalPoolCountsOtherOpsSignals) {
  for (const auto& e : errors_per_rank(2, [](Communicator& comm) {
         check_gin_request(comm, {4096, 60000, 1}, kNccl228, 5536);
       }))
    EXPECT_EQ(e, "");
  for (const auto& e : errors_per_rank(2, [](Communicator& comm) {
         check_gin_request(comm, {4096, 60000, 1}, kNccl228, 5537);
       }))
    EXPECT_NE(e.find("signal_slots 60000 (besides the 5537 that this Communicator's other ops "
                     "hold) exceed the 65536"),
              std::string::npos)
        << e;
  // Per device communicator (2.29 on), other ops' signals do not count.
  const GinLimits later = gin_limits(23007, no_env);
  for (const auto& e : errors_per_rank(2, [&](Communicator& comm) {
         check_gin_request(comm, {4096, 60000, 1}, later, 1 << 23);
       }))
    EXPECT_EQ(e, "");
}

// Ranks whose environments differ (one rank's NCCL_GIN_SIGNAL_POOL_SIZE smaller, another's
// NCCL_GIN_NCONTEXTS 0) all refuse, naming the lowest such rank and its setting: none goes on
// into ncclDevCommCreate to wait for the others.
TEST(GinBootstrap, OneRanksLimitReachesEveryRank) {
  const auto errors = errors_per_rank(4, [](Communicator& comm) {
    GinLimits limits = kNccl228;
    if (comm.rank() == 2) limits.signal_pool = 100;
    if (comm.rank() == 3) limits.contexts = 0;
    check_gin_request(comm, {4096, 128, 2}, limits);
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("failed on rank 2: GIN remote path: signal_slots 128 exceed the 100 GIN "
                     "signals NCCL gives (NCCL_GIN_SIGNAL_POOL_SIZE"),
              std::string::npos)
        << e;
  }
  const auto contexts = errors_per_rank(3, [](Communicator& comm) {
    GinLimits limits = kNccl228;
    if (comm.rank() == 1) limits.contexts = 0;
    check_gin_request(comm, {4096, 8, 1}, limits);
  });
  for (const auto& e : contexts)
    EXPECT_NE(e.find("failed on rank 1: GIN remote path: contexts 1 outside the [1, 0] GIN "
                     "contexts NCCL gives a device communicator (NCCL_GIN_NCONTEXTS)"),
              std::string::npos)
        << e;
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
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("set AllToAllConfig::ranks_per_node"), std::string::npos)
        << e.what();
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

// Which libnccl may run the kernels (nccl_api.cu refuses the rest before any NCCL call): built
// with 2.28's headers, a 2.28 library only; with 2.30's, the wheel's or a later one, so that a
// job that loads torch's NCCL is not refused.
TEST(NcclRelease, LibraryMustLayOutTheDeviceCommunicatorAsTheHeaders) {
  EXPECT_EQ(nccl_release_mismatch(22809, 22809), "");
  EXPECT_EQ(nccl_release_mismatch(22809, 22807), "");
  const std::string torch = nccl_release_mismatch(22809, 23007);
  EXPECT_NE(torch.find("built with NCCL 2.28.9's device API headers, whose ncclDevComm only an "
                       "NCCL 2.28 library"),
            std::string::npos)
      << torch;
  EXPECT_NE(torch.find("but this is 2.30.7"), std::string::npos) << torch;
  EXPECT_NE(torch.find("-DPMOE_NCCL_HEADERS=wheel"), std::string::npos) << torch;
  EXPECT_NE(nccl_release_mismatch(22809, 22803), "") << "before GIN";
  EXPECT_EQ(nccl_release_mismatch(23007, 23007), "");
  EXPECT_EQ(nccl_release_mismatch(23007, 23102), "") << "a later NCCL converts the layout";
  const std::string older = nccl_release_mismatch(23007, 22809);
  EXPECT_NE(older.find("this libnccl is the older 2.28.9"), std::string::npos) << older;
}

// One NCCL communicator per Communicator and GPU (shared_nccl_comm.hpp): `opened` counts the
// ncclCommInitRank calls a rank would make, `closed` the teardowns.
struct CommCounts {
  std::atomic<int> opened{0}, closed{0};
  std::shared_ptr<SharedNcclComm> share(Communicator& comm, int device = 0) {
    return share_nccl_comm(
        comm, device, [](int) {},
        [&] {
          ++opened;
          return std::shared_ptr<void>(new int(comm.rank()), [&](void* p) {
            ++closed;
            delete static_cast<int*>(p);
          });
        });
  }
};

TEST(SharedNcclComm, EveryOpOnOneCommunicatorSharesOneNcclComm) {
  CommCounts counts;
  run_ranks(4, [&](Communicator& comm) {
    std::vector<std::shared_ptr<SharedNcclComm>> ops;
    for (int op = 0; op < 5; ++op) ops.push_back(counts.share(comm));
    for (const auto& op : ops) {
      EXPECT_EQ(op.get(), ops[0].get()) << "rank " << comm.rank();
      EXPECT_EQ(*static_cast<int*>(op->nccl_comm()), comm.rank());
    }
    // Another GPU of the same Communicator is another NCCL communicator.
    const auto other_gpu = counts.share(comm, 1);
    EXPECT_NE(other_gpu.get(), ops[0].get());
  });
  EXPECT_EQ(counts.opened.load(), 4 * 2) << "one per rank and GPU, not one per op";
  EXPECT_EQ(counts.closed.load(), 4 * 2) << "the last op's end closes it";
  // Every rank holds the same token.
  std::vector<uint64_t> tokens(3);
  run_ranks(3,
            [&](Communicator& comm) { tokens[size_t(comm.rank())] = counts.share(comm)->token(); });
  EXPECT_NE(tokens[0], 0u);
  EXPECT_EQ(tokens[1], tokens[0]);
  EXPECT_EQ(tokens[2], tokens[0]);
}

// Once every op is gone, the next op opens a new one; where some rank still holds the old one
// and another does not, all open a new one together (none waits in ncclCommInitRank alone).
TEST(SharedNcclComm, RanksThatDisagreeAllOpenAnew) {
  CommCounts counts;
  run_ranks(3, [&](Communicator& comm) {
    auto first = counts.share(comm);
    const uint64_t token = first->token();
    if (comm.rank() == 1) first.reset();  // rank 1 destroyed its op before making the next
    auto second = counts.share(comm);
    EXPECT_NE(second->token(), token) << "rank " << comm.rank();
    comm.barrier();
    first.reset();
    auto third = counts.share(comm);  // `second` is alive on every rank: shared
    EXPECT_EQ(third.get(), second.get());
  });
  EXPECT_EQ(counts.opened.load(), 3 * 2);
  EXPECT_EQ(counts.closed.load(), 3 * 2);
}

// The signals the ops hold reach check() (the shared pool of 2.28); a refusal opens nothing.
TEST(SharedNcclComm, CheckSeesTheSignalsOtherOpsHoldAndRefusesBeforeOpening) {
  CommCounts counts;
  const auto errors = errors_per_rank(2, [&](Communicator& comm) {
    auto first = counts.share(comm);
    first->hold_signals(65000);
    std::vector<int> seen;
    share_nccl_comm(
        comm, 0,
        [&](int held) {
          check_gin_request(comm, {4096, 536, 1}, kNccl228, held);
        },
        [&]() -> std::shared_ptr<void> {
          ADD_FAILURE() << "opened";
          return nullptr;
        });
    share_nccl_comm(
        comm, 0,
        [&](int held) {
          check_gin_request(comm, {4096, 537, 1}, kNccl228, held);
        },
        [&]() -> std::shared_ptr<void> {
          ADD_FAILURE() << "opened";
          return nullptr;
        });
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("signal_slots 537 (besides the 65000 that this Communicator's other ops "
                     "hold) exceed the 65536"),
              std::string::npos)
        << e;
  EXPECT_EQ(counts.opened.load(), 2);
}

}  // namespace
}  // namespace pmoe::cuda
