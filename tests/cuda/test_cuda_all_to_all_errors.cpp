// AllToAll's errors on the CUDA backend, W ranks sharing one GPU: configs refused on every rank at
// construction; bad indices in device memory skipped and raised once; an owner's expert_y in
// another dtype writing no y; more ranks than hardware queues; a rank that never arrives named by
// the kernels (emulated device: also one off-node, with its node).
// Built twice: for the emulated device (runs everywhere) and for a GPU
// (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "all_to_all_cases.hpp"
#include "core/device_runtime.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {
namespace {

using reference::Routing;

// Two ranks on GPU 0 build an AllToAll of `cfg` (4 tokens, 4 experts, top-1, H 64, changed by
// `change`); every rank must be refused at construction with a message containing `reason`.
void expect_refused_on_every_rank(const std::function<void(AllToAllConfig&)>& change,
                                  const std::string& reason) {
  const int W = 2;
  std::vector<std::string> errors(W);
  run_ranks(W, [&](Communicator& comm) {
    AllToAllConfig cfg = make_config(4, 2 * W, 1, 64);
    change(cfg);
    try {
      AllToAll a2a(comm, cfg);
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  }, Device::cuda(0));
  for (int r = 0; r < W; ++r)
    EXPECT_NE(errors[size_t(r)].find(reason), std::string::npos)
        << "rank " << r << ": " << errors[size_t(r)];
}

#if defined(PMOE_TEST_ON_GPU)
// Ranks sharing one GPU split into two nodes: every rank is told why, by name, at construction,
// before any NCCL library is loaded (the release it finds does not matter).
TEST(AllToAllCuda, OnOneGpuANodeSplitIsRefusedByName) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  expect_refused_on_every_rank([](AllToAllConfig& cfg) { cfg.ranks_per_node = 1; },
                               "ranks sharing a GPU cannot take the GPU remote path");
}
#endif

// The packed layout is the CPU backend's; on CUDA it is refused by name, on every rank.
TEST(AllToAllCuda, PackedExpertRowsAreRefusedByName) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  expect_refused_on_every_rank([](AllToAllConfig& cfg) { cfg.packed_expert_rows = true; },
                               "packed_expert_rows is a layout of the CPU backend");
}

// An int64 index whose low 32 bits name a valid expert, but whose value does not fit in int32: the
// device narrows it to a bad index, so the slot is skipped and reported, never sent to the expert
// of its low bits.
TEST(AllToAllCuda, Int64IndexBeyondInt32IsABadIndex) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const AllToAllConfig cfg = make_config(2, 2, 1, 8, DType::f32, DType::f32);
  std::string raised;
  Buffer host_counts(DType::i32, {2});
  run_ranks(1, [&](Communicator& comm) {
    const Device gpu = comm.device();
    AllToAll a2a(comm, cfg);
    Buffer x(DType::f32, {2, 8}, gpu), counts(DType::i32, {2}, gpu),
        expert_x(DType::f32, {2, 2, 8}, gpu), indices(DType::i64, {2, 1}, gpu);
    Buffer host_x(DType::f32, {2, 8}), host_indices(DType::i64, {2, 1});
    host_indices.data<int64_t>()[0] = 0;
    host_indices.data<int64_t>()[1] = (int64_t(1) << 32) + 1;  // low 32 bits: expert 1
    copy(x, host_x);
    copy(indices, host_indices);
    a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor());
    synchronize(comm.stream());
    copy(host_counts, counts);
    try {
      a2a.check_errors();
    } catch (const Error& e) {
      raised = e.what();
    }
  }, Device::cuda(0));
  EXPECT_EQ(host_counts.data<int32_t>()[0], 1);
  EXPECT_EQ(host_counts.data<int32_t>()[1], 0) << "the slot went to the expert of its low bits";
  EXPECT_NE(raised.find("indices[1, 0] = -2147483648 is outside [-1, 2)"), std::string::npos)
      << raised;
  EXPECT_NE(raised.find("an int64 index outside int32 reads as this"), std::string::npos);
}

// Indices the host cannot check (they are in device memory): on rank 0, one out of range and
// one that repeats an expert of its row. Dispatch and combine both skip those slots, so both
// outputs match the reference with the slots at -1; check_errors() raises the first once, on
// rank 0 only; and the next call on the same op, with good indices, works and raises nothing.
TEST(AllToAllCuda, BadIndexOnTheDeviceIsSkippedAndRaisedOnce) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const int W = 2, max_tokens = 6, H = 32, k = 2;
  const AllToAllConfig cfg = make_config(max_tokens, 2 * W, k, H, DType::bf16, DType::bf16);
  std::vector<std::string> failures(W), raised(W);
  run_ranks(W, [&](Communicator& comm) {
    const int rank = comm.rank(), L = cfg.num_experts / W, rows = W * max_tokens;
    const Device gpu = comm.device();
    std::string& failure = failures[size_t(rank)];
    AllToAll a2a(comm, cfg);
    Buffer counts(DType::i32, {L}, gpu), expert_x(DType::bf16, {L, rows, H}, gpu),
        expert_y(DType::bf16, {L, rows, H}, gpu), y(DType::bf16, {max_tokens, H}, gpu);
    Buffer host_counts(DType::i32, {L}), host_expert_x(DType::bf16, {L, rows, H}),
        host_expert_y(DType::bf16, {L, rows, H}), host_y(DType::bf16, {max_tokens, H});
    auto raise_of = [&] {
      synchronize(comm.stream());
      try {
        a2a.check_errors();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    for (int call = 0; call < 2; ++call) {
      std::vector<reference::AllToAllInputs> all;
      for (int r = 0; r < W; ++r)
        all.push_back(reference::make_inputs(cfg, r, max_tokens, uint64_t(20 + call), Routing::random));
      auto& mine = all[size_t(rank)];
      Buffer x = Buffer::like(mine.x, gpu), indices = Buffer::like(mine.indices, gpu),
             weights = Buffer::like(mine.weights, gpu);
      copy(x, mine.x);
      copy(weights, mine.weights);
      Buffer sent = Buffer::like(mine.indices, Device::cpu());  // what the device gets
      copy(sent, mine.indices);
      if (call == 0) {
        if (rank == 0) {
          int32_t* bad = sent.data<int32_t>();
          bad[1 * k + 0] = cfg.num_experts + 3;  // out of range
          bad[2 * k + 1] = bad[2 * k + 0];       // a repeat of the row's first expert
        }
        // What every rank's reference expects of rank 0: those two slots skipped.
        for (const int slot : {1 * k + 0, 2 * k + 1}) all[0].indices.data<int32_t>()[slot] = -1;
      }
      copy(indices, sent);
      copy(expert_x, Buffer(DType::bf16, {L, rows, H}));  // zeros: rows past the counts stay so
      comm.barrier();  // every rank's reference inputs are final before any rank reads them
      a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor());
      const std::string dispatch_raised = raise_of();
      if (call == 0) raised[size_t(rank)] = dispatch_raised;
      else if (!dispatch_raised.empty()) failure = "call 1 raised: " + dispatch_raised;
      copy(host_counts, counts);
      copy(host_expert_x, expert_x);
      if (failure.empty())
        failure = reference::compare_dispatch(cfg, W, reference::reference_dispatch(cfg, W, rank, all),
                                              host_counts, host_expert_x, Tensor(), 0);
      if (failure.empty())
        reference::run_fake_experts(cfg, W, rank, host_counts, host_expert_x, Tensor(), host_expert_y);
      copy(expert_y, host_expert_y);
      a2a.combine(expert_y, indices, weights, y);
      const std::string combine_raised = raise_of();
      if (failure.empty() && !combine_raised.empty()) failure = "combine raised: " + combine_raised;
      copy(host_y, y);
      if (failure.empty())
        failure = reference::compare_bytes("combine y", host_y,
                                           reference::reference_combine(cfg, all[size_t(rank)], DType::bf16));
      if (!failure.empty()) {
        failure = detail::cat("call ", call, ": ", failure);
        return;  // every rank runs every call up to here, so the peers are not left waiting
      }
      comm.barrier();
    }
  }, Device::cuda(0));
  for (int r = 0; r < W; ++r) EXPECT_EQ(failures[size_t(r)], "") << "rank " << r;
  EXPECT_NE(raised[0].find("indices[1, 0] = 7 is outside [-1, 4)"), std::string::npos)
      << raised[0];
  EXPECT_EQ(raised[1], "") << "only the rank that passed the index hears of it";
}

// Two ranks, one device: rank 1 (an owner other than rank 0) sends expert_y as f16 where rank 0
// passes bf16, after rank 0's dispatch left a (non-fatal) bad index in its error word, so rank
// 0's report of the mismatch loses the race for that word and only the waiting block's verdict
// (every owner checked, behind a barrier, before reduce_rows may run) keeps reduce_rows from
// summing f16 rows as bf16 into y. Each rank raises, and neither y is written.
TEST(AllToAllCuda, ExpertYInAnotherDtypeFromAnOwnerOtherThanRank0WritesNoY) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const int W = 2, max_tokens = 6, H = 32, k = 2;
  const AllToAllConfig cfg = make_config(max_tokens, 2 * W, k, H, DType::bf16, DType::bf16);
  std::vector<std::string> raised(W), failures(W);
  run_ranks(W, [&](Communicator& comm) {
    const int rank = comm.rank(), L = cfg.num_experts / W, rows = W * max_tokens;
    const Device gpu = comm.device();
    const DType y_dtype = rank == 1 ? DType::f16 : DType::bf16;
    AllToAll a2a(comm, cfg);
    const auto in = reference::make_inputs(cfg, rank, max_tokens, 31, Routing::random);
    Buffer x = Buffer::like(in.x, gpu), indices = Buffer::like(in.indices, gpu),
           weights = Buffer::like(in.weights, gpu);
    copy(x, in.x);
    copy(weights, in.weights);
    Buffer sent = Buffer::like(in.indices, Device::cpu());
    copy(sent, in.indices);
    if (rank == 0) sent.data<int32_t>()[1 * k + 0] = cfg.num_experts + 3;  // out of range
    copy(indices, sent);
    Buffer counts(DType::i32, {L}, gpu), expert_x(DType::bf16, {L, rows, H}, gpu),
        expert_y(y_dtype, {L, rows, H}, gpu), y(DType::bf16, {max_tokens, H}, gpu);
    Buffer ones(y_dtype, {L, rows, H});  // 1.0 in either dtype: any sum would differ from `before`
    for (size_t i = 0; i < size_t(L) * rows * H; ++i)
      ones.data<uint16_t>()[i] = y_dtype == DType::f16 ? 0x3c00 : 0x3f80;
    copy(expert_y, ones);
    Buffer before(DType::bf16, {max_tokens, H}), after(DType::bf16, {max_tokens, H});
    std::memset(before.data<uint16_t>(), 0x7b, size_t(max_tokens) * H * sizeof(uint16_t));
    copy(y, before);
    comm.barrier();
    a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor());
    a2a.combine(expert_y, indices, weights, y);
    synchronize(comm.stream());
    try {
      a2a.check_errors();
    } catch (const Error& e) {
      raised[size_t(rank)] = e.what();
    }
    copy(after, y);
    failures[size_t(rank)] = reference::compare_bytes("y (not written)", after, before);
  }, Device::cuda(0));
  for (int r = 0; r < W; ++r) EXPECT_EQ(failures[size_t(r)], "") << "rank " << r;
  EXPECT_NE(raised[0].find("is outside [-1, 4)"), std::string::npos) << raised[0];
  EXPECT_NE(raised[1].find("rank 0 sent expert_y as bf16 but this rank's is f16"), std::string::npos)
      << raised[1];
}

// More ranks on one device than it has hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 32 as pmoe
// sets it): every rank gets an error that says what to set, at construction, and nothing hangs.
TEST(AllToAllCuda, MoreRanksThanHardwareQueuesIsAnError) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const int W = detail::device_max_connections() + 1;
  std::vector<std::string> errors(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) {
    try {
      AllToAll a2a(comm, make_config(2, W, 1, 16));
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  }, Device::cuda(0));
  for (int r = 0; r < W; ++r)
    EXPECT_NE(errors[size_t(r)].find(detail::cat(W, " streams of this process share the device, "
                                                 "but CUDA_DEVICE_MAX_CONNECTIONS is ", W - 1)),
              std::string::npos) << "rank " << r << ": " << errors[size_t(r)];
}

// A rank that never calls dispatch: the other ranks' kernels give up after PMOE_TIMEOUT_S, count
// no rows for any expert, and the host raises an error naming it: first while the kernels may
// still run, as every launch's entry reads the error record (without synchronising: it must see
// the record whole once it sees its code), then after a synchronisation.
TEST(AllToAllCuda, RankThatNeverArrivesIsNamed) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  setenv("PMOE_TIMEOUT_S", "1", 1);
  std::vector<std::string> errors(3), unsynchronised(3);
  std::vector<std::vector<int32_t>> counted(3);
  run_ranks(3, [&](Communicator& comm) {
    const AllToAllConfig cfg = make_config(4, 6, 2, 32);
    AllToAll a2a(comm, cfg);
    if (comm.rank() == 2) return;
    const auto in = reference::make_inputs(cfg, comm.rank(), 4, 3, Routing::random);
    const Device gpu = comm.device();
    auto [x, indices, weights] = inputs_on(in, gpu);
    Buffer counts(DType::i32, {2}, gpu), expert_x(DType::bf16, {2, 12, 32}, gpu);
    Buffer host_counts(DType::i32, {2});
    host_counts.data<int32_t>()[0] = host_counts.data<int32_t>()[1] = 12345;  // not a count
    copy(counts, host_counts);
    a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (std::string& early = unsynchronised[size_t(comm.rank())];
         early.empty() && std::chrono::steady_clock::now() < deadline;) {
      try {
        a2a.check_errors();
        std::this_thread::yield();
      } catch (const Error& e) {
        early = e.what();
      }
    }
    synchronize(comm.stream());
    copy(host_counts, counts);
    counted[size_t(comm.rank())].assign(host_counts.data<int32_t>(), host_counts.data<int32_t>() + 2);
    try {
      a2a.check_errors();
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  }, Device::cuda(0));
  unsetenv("PMOE_TIMEOUT_S");
  for (int r : {0, 1}) {
    const std::string& early = unsynchronised[size_t(r)];
    EXPECT_NE(early.find("rank 2 did not arrive within 1 s"), std::string::npos) << early;
    EXPECT_NE(errors[size_t(r)].find("rank 2 did not arrive within 1 s"), std::string::npos)
        << errors[size_t(r)];
    EXPECT_EQ(counted[size_t(r)], std::vector<int32_t>({0, 0})) << "rank " << r;
  }
}

#if !defined(PMOE_TEST_ON_GPU)
// Four ranks as two nodes of two; rank 3 (node 1) never calls dispatch: rank 0 and 1 (node 0),
// which reach it only through the remote path, name it and its node after the timeout. In
// hierarchical mode rank 1 waits for rank 3's relay block, and rank 0 for the forward rank 1
// never makes: both still name rank 3, the one that did not come.
class RemoteRankThatNeverArrives : public ::testing::TestWithParam<CrossNode> {};

TEST_P(RemoteRankThatNeverArrives, IsNamedWithItsNode) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  setenv("PMOE_TIMEOUT_S", "1", 1);
  std::vector<std::string> errors(4);
  run_ranks(4, [&](Communicator& comm) {
    AllToAllConfig cfg = make_config(4, 8, 2, 32);
    cfg.ranks_per_node = 2;
    cfg.cross_node = GetParam();
    AllToAll a2a(comm, cfg);
    if (comm.rank() == 3) return;
    const auto in = reference::make_inputs(cfg, comm.rank(), 4, 3, Routing::random);
    const Device gpu = comm.device();
    auto [x, indices, weights] = inputs_on(in, gpu);
    Buffer counts(DType::i32, {2}, gpu), expert_x(DType::bf16, {2, 16, 32}, gpu);
    a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor());
    synchronize(comm.stream());
    try {
      a2a.check_errors();
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  }, Device::cuda(0));
  unsetenv("PMOE_TIMEOUT_S");
  for (int r : {0, 1})
    EXPECT_NE(errors[size_t(r)].find("rank 3 (node 1; this rank is on node 0) did not arrive "
                                     "within 1 s"),
              std::string::npos)
        << errors[size_t(r)];
  // Rank 0 hears from rank 3 through rank 1 (rank 3's relay on node 0), which may be the one
  // missing: the message names it too.
  if (GetParam() == CrossNode::hierarchical) {
    EXPECT_NE(errors[0].find("its tokens come through rank 1, this node's relay for it"),
              std::string::npos)
        << errors[0];
  }
}

INSTANTIATE_TEST_SUITE_P(CrossNode, RemoteRankThatNeverArrives,
                         ::testing::Values(CrossNode::direct, CrossNode::hierarchical),
                         [](const auto& info) {
                           return info.param == CrossNode::direct ? "direct" : "hierarchical";
                         });
#endif

}  // namespace
}  // namespace pmoe::testing
