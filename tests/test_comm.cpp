// The runtime with thread ranks: collectives, symmetric memory and signals, bounded waits and
// the propagation of one rank's failure to the others.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/agree_on_step.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"

namespace pmoe {
namespace {

using Clock = std::chrono::steady_clock;

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

class CommThreads : public ::testing::TestWithParam<int> {};

TEST_P(CommThreads, AllGatherAndBroadcast) {
  const int W = GetParam();
  run_ranks(W, [&](Communicator& comm) {
    EXPECT_EQ(comm.size(), W);
    int32_t mine[2] = {comm.rank(), 100 + comm.rank()};
    const auto all = comm.all_gather(std::as_bytes(std::span(mine)));
    ASSERT_EQ(all.size(), sizeof mine * size_t(W));
    const auto* values = reinterpret_cast<const int32_t*>(all.data());
    for (int r = 0; r < W; ++r) {
      EXPECT_EQ(values[2 * r], r);
      EXPECT_EQ(values[2 * r + 1], 100 + r);
    }
    int64_t token = comm.rank() == W - 1 ? 4242 : -1;
    comm.broadcast(std::as_writable_bytes(std::span(&token, 1)), W - 1);
    EXPECT_EQ(token, 4242);
    EXPECT_EQ(comm.node_ranks().size(), size_t(W));
  });
}

TEST_P(CommThreads, PutAndSignalReachEveryPeer) {
  const int W = GetParam();
  run_ranks(W, [&](Communicator& comm) {
    const int me = comm.rank();
    auto memory = comm.alloc_symmetric(sizeof(int64_t) * size_t(W), W);
    for (int round = 1; round <= 50; ++round) {
      for (int peer = 0; peer < W; ++peer) {
        const int64_t value = me * 1000 + round;
        memory->put(peer, sizeof(int64_t) * size_t(me), &value, sizeof value);
        memory->signal(peer, me, uint64_t(round));
      }
      for (int source = 0; source < W; ++source) {
        memory->wait_signal(source, uint64_t(round), {"test", source, "its value"});
        int64_t got;
        std::memcpy(&got, memory->local() + sizeof(int64_t) * size_t(source), sizeof got);
        EXPECT_EQ(got, source * 1000 + round);
      }
      comm.barrier();  // nobody overwrites a value before every rank has read it
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommThreads, ::testing::Values(1, 2, 3, 4, 8),
                         [](const auto& info) { return "W" + std::to_string(info.param); });

TEST(CommThreads, ExceptionOnOneRankReachesCallerAndStopsOthersFast) {
  const auto start = Clock::now();  // default timeout: 60 s, so fast means the group failure
  std::vector<std::string> peer_errors(4);
  try {
    run_ranks(4, [&](Communicator& comm) {
      if (comm.rank() == 2) throw std::runtime_error("boom on rank 2");
      try {
        comm.barrier();
      } catch (const Error& e) {
        peer_errors[size_t(comm.rank())] = e.what();
        throw;
      }
    });
    FAIL() << "run_ranks did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom on rank 2");
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  for (int r : {0, 1, 3}) {
    EXPECT_NE(peer_errors[size_t(r)].find("rank 2 failed: boom on rank 2"), std::string::npos)
        << peer_errors[size_t(r)];
  }
}

TEST(CommThreads, BarrierTimeoutNamesTheMissingRank) {
  ScopedEnv timeout("PMOE_TIMEOUT_S", "0.5");
  std::vector<std::string> errors(3);
  run_ranks(3, [&](Communicator& comm) {
    if (comm.rank() == 1) return;  // never arrives
    try {
      comm.barrier();
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  });
  for (int r : {0, 2}) {
    EXPECT_NE(errors[size_t(r)].find("barrier on rank " + std::to_string(r) +
                                     ": rank(s) 1 did not arrive within 0.5 s"),
              std::string::npos)
        << errors[size_t(r)];
  }
}

TEST(CommThreads, SignalWaitTimeoutNamesOpPeerAndEvent) {
  ScopedEnv timeout("PMOE_TIMEOUT_S", "0.2");
  std::string error;
  run_ranks(2, [&](Communicator& comm) {
    auto memory = comm.alloc_symmetric(64, 1);
    if (comm.rank() != 0) return;
    try {
      memory->wait_signal(0, 7, {"MyOp::step", 1, "its flag"});
    } catch (const Error& e) {
      error = e.what();
    }
  });
  EXPECT_NE(error.find("MyOp::step on rank 0: rank 1 did not arrive within 0.2 s (waited for "
                       "its flag: signal 0 to reach 7, it is at 0); if rank 1 threw, its own "
                       "error says why (a call one rank rejects never reaches its peers)"),
            std::string::npos)
      << error;
}

TEST(CommThreads, BadTimeoutSettingIsRejected) {
  ScopedEnv timeout("PMOE_TIMEOUT_S", "soon");
  try {
    run_ranks(1, [](Communicator&) {});
    FAIL() << "accepted PMOE_TIMEOUT_S=soon";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PMOE_TIMEOUT_S must be a positive number"),
              std::string::npos);
  }
}

TEST(CommThreads, SetUpErrorOfOneRankIsRaisedOnEveryRank) {
  // 3 thread ranks; agree_on_step is the MPI and socket communicators' set-up error exchange.
  constexpr int W = 3;
  std::vector<std::string> errors(W);
  run_ranks(W, [&](Communicator& comm) {
    detail::agree_on_step(comm, "", "step 1");  // nobody failed: no error
    const std::string mine = comm.rank() == 1 ? std::string(600, 'x') : "";
    try {
      detail::agree_on_step(comm, mine, "alloc_symmetric (map)");
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  });
  const std::string want = "alloc_symmetric (map) failed on rank 1: " + std::string(479, 'x');
  for (int r = 0; r < W; ++r) EXPECT_NE(errors[size_t(r)].find(want), std::string::npos) << r;
  for (int r = 0; r < W; ++r) EXPECT_EQ(errors[size_t(r)].find(std::string(480, 'x')),
                                        std::string::npos) << "the text is cut at 479 bytes";
}

TEST(CommThreads, ZeroRanksIsRejected) {
  EXPECT_THROW(run_ranks(0, [](Communicator&) {}), Error);
}

}  // namespace
}  // namespace pmoe
