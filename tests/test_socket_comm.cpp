// SocketCommunicator (the communicator pmoe.torch builds under torchrun): W = 2, 3, 4 ranks as
// threads of this process, each with its own communicator over pmoe's TCP mesh, placed on one
// node (shared memory), on one node each (every put a TCP frame), or on two nodes. Checks the
// set-up collectives, AllToAll cases against the reference, and the errors a user can cause.
// On cuda:0 (the emulated device only: CUDA IPC refuses a process's own memory, so on a GPU the
// processes of python.torchrun_cuda.2 test it): W = 2, 3 on one node, and split into nodes.
// Runs under the sanitizer presets too (the transport's locking is what TSan checks).
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "all_to_all_cases.hpp"
#include "comm/socket_regions.hpp"
#include "comm/wait.hpp"
#include "pmoe/error.hpp"
#include "pmoe/socket_communicator.hpp"
#include "pmoe/stream.hpp"

namespace pmoe {
namespace {

using Placement = std::function<std::string(int rank, int size)>;

std::string one_node(int, int) { return "n0"; }
std::string own_node(int rank, int) { return "n" + std::to_string(rank); }
std::string two_nodes(int rank, int size) { return rank * 2 < size ? "a" : "b"; }

// Runs fn on `size` thread ranks, each with its own SocketCommunicator; returns each rank's error
// text ("" when it passed).
std::vector<std::string> run_socket_ranks(int size, const Placement& node_of,
                                          const std::function<void(Communicator&)>& fn,
                                          const std::function<Device(int rank)>& device_of =
                                              [](int) { return Device::cpu(); }) {
  static std::atomic<int> jobs{0};
  const std::string job = "test." + std::to_string(::getpid()) + "." + std::to_string(jobs++);
  const auto n = static_cast<size_t>(size);
  std::vector<std::string> addresses(n), nodes(n), errors(n);
  std::vector<SocketCommunicator::Listener> listeners;
  for (int r = 0; r < size; ++r) {
    listeners.emplace_back("127.0.0.1");
    addresses[size_t(r)] = "127.0.0.1:" + std::to_string(listeners.back().port());
    nodes[size_t(r)] = node_of(r, size);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        SocketCommunicator comm(std::move(listeners[size_t(r)]), r, addresses, nodes, job,
                                device_of(r));
        fn(comm);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void expect_all_passed(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

struct Layout {
  const char* name;
  std::string (*node_of)(int, int);
};
const Layout kLayouts[] = {
    {"one_node", one_node}, {"own_node", own_node}, {"two_nodes", two_nodes}};

TEST(SocketComm, CollectivesAndNodeRanks) {
  for (const Layout& layout : kLayouts) {
    for (int size : {1, 2, 3, 4}) {
      SCOPED_TRACE(std::string(layout.name) + " W=" + std::to_string(size));
      expect_all_passed(run_socket_ranks(size, layout.node_of, [&](Communicator& comm) {
        const int r = comm.rank();
        // node_ranks: the ranks whose node name equals this rank's.
        std::vector<int> mates;
        for (int p = 0; p < size; ++p)
          if (layout.node_of(p, size) == layout.node_of(r, size)) mates.push_back(p);
        PMOE_CHECK(comm.node_ranks() == mates, "node_ranks differ from the placement");
        for (int round = 0; round < 3; ++round) {
          const uint64_t mine = uint64_t(r * 100 + round);
          const auto all = comm.all_gather(std::as_bytes(std::span(&mine, 1)));
          for (int p = 0; p < size; ++p) {
            uint64_t theirs;
            std::memcpy(&theirs, all.data() + size_t(p) * 8, 8);
            PMOE_CHECK(theirs == uint64_t(p * 100 + round), "all_gather: rank ", p, " gave ",
                       theirs);
          }
          uint64_t value = r == round % size ? 4242 + uint64_t(round) : 0;
          comm.broadcast(std::as_writable_bytes(std::span(&value, 1)), round % size);
          PMOE_CHECK(value == 4242 + uint64_t(round), "broadcast gave ", value);
          comm.barrier();
        }
      }));
    }
  }
}

TEST(SocketComm, AllToAllMatchesReference) {
  for (const Layout& layout : kLayouts) {
    for (int size : {2, 3, 4}) {
      testing::AllToAllCase c;
      c.config = testing::make_config(6, 2 * size, 3, 40, DType::bf16, DType::f32);
      c.tokens = size == 3 ? testing::TokenCounts::zero_on_odd : testing::TokenCounts::random;
      c.expert_y_dtype = DType::f32;
      c.calls = 3;
      c.split_phases = size == 4;
      c.seed = uint64_t(size) * 7;
      SCOPED_TRACE(std::string(layout.name) + " " + testing::describe(c));
      expect_all_passed(run_socket_ranks(size, layout.node_of, [&](Communicator& comm) {
        const auto result = testing::run_all_to_all_case(comm, c);
        PMOE_CHECK(result.error.empty(), result.error);
      }));
    }
  }
}

// Large puts both ways between two nodes: each rank's sends fill the socket while its peer is
// sending too; the transport must read while it writes, or both block.
TEST(SocketComm, LargeExchangeAcrossNodes) {
  testing::AllToAllCase c;
  c.config = testing::make_config(256, 4, 4, 4096, DType::f32, DType::f32);  // 4 MiB a way
  c.tokens = testing::TokenCounts::full;
  c.expert_y_dtype = DType::f32;
  c.calls = 2;
  expect_all_passed(run_socket_ranks(2, own_node, [&](Communicator& comm) {
    const auto result = testing::run_all_to_all_case(comm, c);
    PMOE_CHECK(result.error.empty(), result.error);
  }));
}

TEST(SocketComm, RanksDisagreeingOnSizesFailEverywhere) {
  const auto errors = run_socket_ranks(3, two_nodes, [](Communicator& comm) {
    const size_t bytes = comm.rank() == 1 ? 4096 : 8192;
    comm.alloc_symmetric(bytes, 2);
  });
  for (size_t r = 0; r < errors.size(); ++r)
    EXPECT_NE(errors[r].find("disagree"), std::string::npos) << "rank " << r << ": " << errors[r];
}

TEST(SocketComm, PeerThatLeavesIsNamed) {
  const auto errors = run_socket_ranks(2, own_node, [](Communicator& comm) {
    if (comm.rank() == 1) return;  // leaves: its destructor closes the connections
    comm.barrier();
  });
  EXPECT_NE(errors[0].find("rank 1 closed its connection"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], "");
}

// Two ranks of one node allowed one CPU between them (torchrun's 4 ranks on 2 cores, in small):
// their waits must block early rather than spin the CPU their peer needs. The policy is
// process-wide and only ever tightens, so only this direction can be checked here.
TEST(SocketComm, RanksOutnumberingTheirNodesCpusMakeWaitsBlockEarly) {
  if (std::getenv("PMOE_WAIT")) GTEST_SKIP() << "PMOE_WAIT chooses the policy";
  cpu_set_t all, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &all)) {
      CPU_SET(c, &one);
      break;
    }
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);  // the rank threads inherit it
  expect_all_passed(run_socket_ranks(2, one_node, [](Communicator& comm) { comm.barrier(); }));
  ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
  EXPECT_EQ(detail::wait_policy().yield_for, std::chrono::microseconds(50))
      << "two ranks on one CPU, yet waits spin and yield as if each had a core";
}

// Device memory shared through (emulated) CUDA IPC; ops on each rank's stream.
TEST(SocketComm, AllToAllOnACudaDevice) {
  if (!cuda_available_in_build() || !cuda_emulated())
    GTEST_SKIP() << "thread ranks share one process, whose own memory CUDA IPC refuses on a GPU";
  for (int size : {2, 3}) {
    for (int per_node : {0, 1}) {  // 1: every rank its own node, through the remote path
      testing::AllToAllCase c;
      c.config = testing::make_config(6, 2 * size, 3, 40, DType::bf16, DType::f32);
      c.config.ranks_per_node = per_node;
      c.tokens = size == 3 ? testing::TokenCounts::zero_on_odd : testing::TokenCounts::random;
      c.expert_y_dtype = DType::f32;
      c.calls = 3;
      c.device = Device::cuda(0);
      SCOPED_TRACE(testing::describe(c) + " ranks_per_node " + std::to_string(per_node));
      expect_all_passed(run_socket_ranks(
          size, one_node,
          [&](Communicator& comm) {
            PMOE_CHECK(comm.device() == Device::cuda(0) && comm.stream().handle != nullptr,
                       "no stream on cuda:0");
            const auto result = testing::run_all_to_all_case(comm, c);
            PMOE_CHECK(result.error.empty(), result.error);
          },
          [](int) { return Device::cuda(0); }));
    }
  }
}

// Every rank fails alike, naming why: no rank waits for one that refused.
TEST(SocketComm, CudaDeviceErrorsFailEverywhere) {
  if (!cuda_available_in_build() || !cuda_emulated())
    GTEST_SKIP() << "thread ranks share one process, whose own memory CUDA IPC refuses on a GPU";
  const auto kinds = run_socket_ranks(
      2, one_node, [](Communicator&) {},
      [](int r) { return r == 0 ? Device::cuda(0) : Device::cpu(); });
  for (const auto& e : kinds) EXPECT_NE(e.find("kind of device"), std::string::npos) << e;
  const auto nodes = run_socket_ranks(
      2, own_node, [](Communicator& comm) { comm.alloc_symmetric(1024, 1); },
      [](int) { return Device::cuda(0); });
  for (const auto& e : nodes) EXPECT_NE(e.find("CUDA IPC reaches the ranks of this node only"),
                                        std::string::npos) << e;
}

TEST(SocketComm, BadArguments) {
  SocketCommunicator::Listener listener("127.0.0.1");
  EXPECT_THROW(SocketCommunicator(std::move(listener), 2, {"127.0.0.1:1"}, {"n"}, "job"), Error);
  SocketCommunicator::Listener other("127.0.0.1");
  EXPECT_THROW(SocketCommunicator(std::move(other), 0, {"x:1", "y:2"}, {"n"}, "job"), Error);
  SocketCommunicator::Listener third("127.0.0.1");
  EXPECT_THROW(SocketCommunicator(std::move(third), 0, {"x:1"}, {"n"}, "a/b"), Error);
}

// A newcomer in a lost rank's place takes over an allocation only when every survivor hands the
// same one to it; each rank judges the gathered requests alike (tests/robustness/replace_rank.cpp
// runs the whole admission).
TEST(SocketComm, AHandOverIsAgreedOrRefusedAlikeOnEveryRank) {
  using detail::AllocationRequest;
  auto judge = [](int rank, const std::vector<AllocationRequest>& all, uint64_t* serial) {
    std::vector<std::byte> gathered(all.size() * sizeof(AllocationRequest));
    std::memcpy(gathered.data(), all.data(), gathered.size());
    return detail::agreed_hand_over(rank, gathered, all[size_t(rank)], serial);
  };
  uint64_t serial = 99;
  const std::vector<AllocationRequest> fresh(3, AllocationRequest{128, 2, -1, 0});
  for (int r = 0; r < 3; ++r) EXPECT_EQ(judge(r, fresh, &serial), -1);
  const std::vector<AllocationRequest> handed = {{128, 2, 1, 5}, {128, 2, -1, 0}, {128, 2, 1, 5}};
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(judge(r, handed, &serial), 1);
    EXPECT_EQ(serial, 5u);
  }
  // A survivor that allocates while the others hand over, two allocations, other sizes.
  const std::vector<std::vector<AllocationRequest>> refused = {
      {{128, 2, 1, 5}, {128, 2, -1, 0}, {128, 2, -1, 0}},
      {{128, 2, 1, 5}, {128, 2, -1, 0}, {128, 2, 1, 6}},
      {{128, 2, 1, 5}, {256, 2, -1, 0}, {128, 2, 1, 5}}};
  for (const auto& requests : refused)
    for (int r = 0; r < 3; ++r) EXPECT_THROW(judge(r, requests, &serial), Error);
}

}  // namespace
}  // namespace pmoe
