// pmoe::CudaGraph (include/pmoe/graph.hpp) on the CPU: no device, and 2 ranks as threads on the
// CPU backend. A capture there is a clear pmoe::Error before the work runs, in every build (with a
// CUDA runtime or without), and the op it would have captured stays usable. The captures that
// work are in tests/cuda/test_cuda_graph_replay.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "all_to_all_cases.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "pmoe/graph.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {
namespace {

constexpr const char* kNullStream = "CudaGraph: the null Stream cannot be captured";

TEST(CudaGraphOnCpu, TheNullStreamIsAClearErrorAndTheWorkNeverRuns) {
  bool ran = false;
  try {
    CudaGraph graph(Stream(), [&] { ran = true; });
    ADD_FAILURE() << "a capture on the null Stream was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(kNullStream), std::string::npos) << e.what();
  }
  EXPECT_FALSE(ran);
}

// Each rank tries to capture its dispatch on comm.stream() (null on the CPU), then makes the call
// for real: the round still matches the reference.
TEST(CudaGraphOnCpu, ACpuRanksOpCannotBeCapturedAndStaysUsable) {
  const int W = 2;
  const AllToAllConfig cfg = make_config(5, 4, 2, 16);
  std::vector<std::string> errors(W);
  run_ranks(W, [&](Communicator& comm) {
    const int rank = comm.rank(), L = cfg.num_experts / W, rows = W * cfg.max_tokens;
    std::string& error = errors[size_t(rank)];
    std::vector<reference::AllToAllInputs> all;
    for (int r = 0; r < W; ++r)
      all.push_back(reference::make_inputs(cfg, r, 3 + r, 5, reference::Routing::random));
    const auto& mine = all[size_t(rank)];
    AllToAll a2a(comm, cfg);
    Buffer counts(DType::i32, {L}), expert_x(DType::bf16, {L, rows, cfg.hidden_dim}),
        expert_y(DType::bf16, {L, rows, cfg.hidden_dim}), y(DType::bf16, {mine.m, cfg.hidden_dim});
    auto dispatch = [&] {
      a2a.dispatch(mine.x, Tensor(), mine.indices, counts, expert_x, Tensor());
    };
    bool ran = false;
    try {
      CudaGraph graph(comm.stream(), [&] {
        ran = true;
        dispatch();
      });
      error = "a CPU rank's capture was accepted";
    } catch (const Error& e) {
      if (std::string(e.what()).find(kNullStream) == std::string::npos) error = e.what();
    }
    if (ran) error = "the capture ran the work";
    if (!error.empty()) return;  // before the collective calls: the test fails, nobody waits
    dispatch();
    error = reference::compare_dispatch(cfg, W, reference::reference_dispatch(cfg, W, rank, all),
                                        counts, expert_x, Tensor(), 0);
    reference::run_fake_experts(cfg, W, rank, counts, expert_x, Tensor(), expert_y);
    a2a.combine(expert_y, mine.indices, mine.weights, y);
    if (error.empty())
      error =
          reference::compare_bytes("y", y, reference::reference_combine(cfg, mine, DType::bf16));
  });
  for (int r = 0; r < W; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

}  // namespace
}  // namespace pmoe::testing
