// pmoe::CudaGraph (include/pmoe/graph.hpp) on cuda:0, through the public API only: 4 ranks as
// threads sharing the device, each capturing its AllToAll dispatch and combine once with bound_m
// and replaying them with new routing and a new m (0 to max_tokens) before each replay,
// checked against the plain reference; 2 ranks, one capturing while the other allocates, copies
// and synchronises; 1 rank, whose capture fails (a host synchronisation, a throwing work) and
// leaves a clear error and a usable stream, and whose graphs move. Built for the emulated device
// and for a GPU (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "all_to_all_cases.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "pmoe/graph.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {
namespace {

using reference::Routing;

// pmoe::copy of one i32 into device memory.
void write_i32(const Tensor& dst, int32_t value) { copy(dst, Tensor(&value, DType::i32, {1})); }

// The first error a rank's call raises, or "".
template <typename Call>
std::string error_of(Call&& call) {
  try {
    call();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Rank r's m in a replay: every value from 0 to max_tokens turns up, and no rank keeps its m.
int m_of(int replay, int rank, int max_tokens) {
  return (replay * 7 + rank * 5) % (max_tokens + 1);
}

TEST(CudaGraphReplay, AllToAllReplaysWithNewRoutingAndBoundM) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const int W = 4, max_tokens = 12, H = 64, k = 3, kReplays = 6;
  constexpr uint8_t kSentinel = 0xA5;
  const AllToAllConfig cfg = make_config(max_tokens, 2 * W, k, H);
  std::vector<std::string> errors(W);
  run_ranks(
      W,
      [&](Communicator& comm) {
        const int rank = comm.rank(), L = cfg.num_experts / W, rows = W * max_tokens;
        const Device gpu = comm.device();
        std::string& error = errors[size_t(rank)];
        auto note = [&](const std::string& what) {
          if (error.empty()) error = what;
        };
        AllToAll a2a(comm, cfg);
        Buffer x(DType::bf16, {max_tokens, H}, gpu), indices(DType::i32, {max_tokens, k}, gpu),
            weights(DType::f32, {max_tokens, k}, gpu), counts(DType::i32, {L}, gpu),
            expert_x(DType::bf16, {L, rows, H}, gpu), expert_y(DType::bf16, {L, rows, H}, gpu),
            y(DType::bf16, {max_tokens, H}, gpu), bound_m(DType::i32, {1}, gpu);
        Buffer host_counts(DType::i32, {L}), host_expert_x(DType::bf16, {L, rows, H}),
            host_expert_y(DType::bf16, {L, rows, H}), host_y(DType::bf16, {max_tokens, H}),
            sentinel(DType::bf16, {L, rows, H}), y_sentinel(DType::bf16, {max_tokens, H});
        std::memset(sentinel.data<void>(), kSentinel, sentinel.nbytes());
        std::memset(y_sentinel.data<void>(), kSentinel, y_sentinel.nbytes());
        for (int e = 0; e < L; ++e) host_counts.data<int32_t>()[e] = -1;
        copy(counts, host_counts);

        // Captured, not run: the counts keep their -1 until a replay.
        comm.barrier();
        std::optional<CudaGraph> dispatch_graph, combine_graph;
        note(error_of([&] {
          dispatch_graph.emplace(comm.stream(), [&] {
            a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor(), Phase::both, bound_m);
          });
          combine_graph.emplace(comm.stream(), [&] {
            a2a.combine(expert_y, indices, weights, y, Phase::both, bound_m);
          });
        }));
        synchronize(comm.stream());
        copy(host_counts, counts);
        for (int e = 0; e < L; ++e)
          if (host_counts.data<int32_t>()[e] != -1) note("the capture ran the dispatch");
        const bool captured = dispatch_graph && combine_graph;

        // Every rank replays every time, even after a failure: its peers' kernels wait for it.
        for (int replay = 0; replay < kReplays; ++replay) {
          const uint64_t seed = 100 + uint64_t(replay);
          // Inputs of max_tokens rows on the device; the reference sees each rank's first m rows,
          // which make_inputs draws the same whatever m is.
          std::vector<reference::AllToAllInputs> used;
          for (int r = 0; r < W; ++r)
            used.push_back(reference::make_inputs(cfg, r, m_of(replay, r, max_tokens), seed,
                                                  Routing::dropped));
          const reference::AllToAllInputs full =
              reference::make_inputs(cfg, rank, max_tokens, seed, Routing::dropped);
          const int m = used[size_t(rank)].m;
          copy(x, full.x);
          copy(indices, full.indices);
          copy(weights, full.weights);
          write_i32(bound_m, m);
          copy(expert_x, sentinel);
          copy(y, y_sentinel);
          comm.barrier();  // every rank's inputs are in place before any replay reads a peer's
          if (captured) dispatch_graph->replay();
          synchronize(comm.stream());
          note(error_of([&] { a2a.check_errors(); }));
          copy(host_counts, counts);
          copy(host_expert_x, expert_x);
          if (error.empty()) {
            const std::string wrong = reference::compare_dispatch(
                cfg, W, reference::reference_dispatch(cfg, W, rank, used), host_counts,
                host_expert_x, Tensor(), kSentinel);
            if (!wrong.empty()) note(detail::cat("replay ", replay, " (m = ", m, "): ", wrong));
          }
          if (error.empty())  // counts from a failed dispatch may not be counts
            reference::run_fake_experts(cfg, W, rank, host_counts, host_expert_x, Tensor(),
                                        host_expert_y);
          copy(expert_y, host_expert_y);
          if (captured) combine_graph->replay();
          synchronize(comm.stream());
          note(error_of([&] { a2a.check_errors(); }));
          copy(host_y, y);
          if (error.empty()) {
            const std::string wrong = reference::compare_bytes(
                "combine y", Tensor(host_y.data<void>(), DType::bf16, {m, H}),
                reference::reference_combine(cfg, used[size_t(rank)], DType::bf16));
            if (!wrong.empty()) note(detail::cat("replay ", replay, " (m = ", m, "): ", wrong));
          }
          comm.barrier();  // nobody rewrites its inputs while a peer's replay may still read them
        }
      },
      Device::cuda(0));
  for (int r = 0; r < W; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

// Thread-local capture: while rank 0 is inside its capture, rank 1 allocates device memory and
// waits for its stream (both forbidden to every thread under a global-mode capture).
TEST(CudaGraphReplay, OtherRanksKeepLaunchingWhileOneCaptures) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  std::vector<std::string> errors(2);
  run_ranks(
      2,
      [&](Communicator& comm) {
        std::string& error = errors[size_t(comm.rank())];
        if (comm.rank() == 0) {
          error = error_of([&] {
            CudaGraph graph(comm.stream(), [&] {
              comm.barrier();  // rank 1 starts
              comm.barrier();  // rank 1 is done
            });
            graph.replay();
            synchronize(comm.stream());
          });
          return;
        }
        comm.barrier();
        error = error_of([&] {
          const int32_t values[4] = {3, 1, 4, 1};
          Buffer on_device(DType::i32, {4}, comm.device()), back(DType::i32, {4});
          copy(on_device, Tensor(const_cast<int32_t*>(values), DType::i32, {4}));
          synchronize(comm.stream());
          copy(back, on_device);
          PMOE_CHECK(std::memcmp(back.data<void>(), values, sizeof values) == 0,
                     "rank 1's round trip through the device changed the values");
        });
        comm.barrier();
      },
      Device::cuda(0));
  EXPECT_EQ(errors[0], "") << "the capturing rank";
  EXPECT_EQ(errors[1], "") << "the rank that kept launching";
}

// A world of one rank and its AllToAll, whose dispatch and combine of all its tokens run eagerly
// or from graphs, and whose round is checked against the reference.
class OneRank {
 public:
  explicit OneRank(Communicator& comm)
      : comm_(comm),
        a2a_(comm, make_config(4, 2, 2, 32)),
        all_(inputs_of(a2a_.config())),
        on_(inputs_on(all_[0], comm.device())) {}

  void dispatch() { a2a_.dispatch(on_.x, Tensor(), on_.indices, counts_, expert_x_, Tensor()); }
  void combine() { a2a_.combine(expert_y_, on_.indices, on_.weights, y_); }

  // Runs `dispatch_step`, the reference's stand-in experts on the host, then `combine_step`;
  // "" when the counts, rows and y match the reference.
  std::string round(const std::function<void()>& dispatch_step,
                    const std::function<void()>& combine_step) {
    const AllToAllConfig& cfg = a2a_.config();
    // Zeros, so that a step that did not run shows (every round has the same inputs).
    copy(counts_, Buffer(DType::i32, {kL}));
    copy(expert_x_, Buffer(DType::bf16, {kL, kRows, kH}));
    copy(y_, Buffer(DType::bf16, {kRows, kH}));
    dispatch_step();
    synchronize(comm_.stream());
    if (std::string recorded = error_of([&] { a2a_.check_errors(); }); !recorded.empty())
      return "dispatch: " + recorded;
    copy(host_counts_, counts_);
    copy(host_expert_x_, expert_x_);
    std::string wrong =
        reference::compare_dispatch(cfg, 1, reference::reference_dispatch(cfg, 1, 0, all_),
                                    host_counts_, host_expert_x_, Tensor(), 0);
    if (!wrong.empty()) return "dispatch: " + wrong;
    reference::run_fake_experts(cfg, 1, 0, host_counts_, host_expert_x_, Tensor(), host_expert_y_);
    copy(expert_y_, host_expert_y_);
    combine_step();
    synchronize(comm_.stream());
    if (std::string recorded = error_of([&] { a2a_.check_errors(); }); !recorded.empty())
      return "combine: " + recorded;
    copy(host_y_, y_);
    return reference::compare_bytes("y", host_y_,
                                    reference::reference_combine(cfg, all_[0], DType::bf16));
  }
  std::string eager_round() {
    return round([&] { dispatch(); }, [&] { combine(); });
  }

 private:
  static constexpr int kL = 2, kRows = 4, kH = 32;  // make_config(4, 2, 2, 32) on one rank
  static std::vector<reference::AllToAllInputs> inputs_of(const AllToAllConfig& cfg) {
    std::vector<reference::AllToAllInputs> all;
    all.push_back(reference::make_inputs(cfg, 0, kRows, 7, Routing::random));
    return all;
  }
  Communicator& comm_;
  AllToAll a2a_;
  std::vector<reference::AllToAllInputs> all_;  // the one rank's, as the reference takes them
  InputsOn on_;
  Buffer counts_{DType::i32, {kL}, comm_.device()};
  Buffer expert_x_{DType::bf16, {kL, kRows, kH}, comm_.device()};
  Buffer expert_y_{DType::bf16, {kL, kRows, kH}, comm_.device()};
  Buffer y_{DType::bf16, {kRows, kH}, comm_.device()};
  Buffer host_counts_{DType::i32, {kL}}, host_expert_x_{DType::bf16, {kL, kRows, kH}};
  Buffer host_expert_y_{DType::bf16, {kL, kRows, kH}}, host_y_{DType::bf16, {kRows, kH}};
};

// A capture whose work waits for the device, or throws, fails with an error that says so; the
// stream and the op go on as before (on a GPU: no kernel launch meets the capture's CUDA error).
TEST(CudaGraphReplay, AFailedCaptureIsAClearErrorAndLeavesTheStreamUsable) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  run_ranks(
      1,
      [&](Communicator& comm) {
        OneRank one(comm);
        const std::string synchronising =
            error_of([&] { CudaGraph graph(comm.stream(), [&] { synchronize(comm.stream()); }); });
        EXPECT_NE(synchronising.find("CudaGraph: capture failed: cudaStreamSynchronize"),
                  std::string::npos)
            << synchronising;
        EXPECT_EQ(one.eager_round(), "") << "after a capture that synchronised";

        const std::string throwing = error_of([&] {
          CudaGraph graph(comm.stream(), [] { throw std::runtime_error("the work's own error"); });
        });
        EXPECT_EQ(throwing, "the work's own error");
        EXPECT_EQ(one.eager_round(), "") << "after a capture whose work threw";
      },
      Device::cuda(0));
}

// Graphs moved by construction and by assignment replay what was captured; a moved-from graph
// throws instead of launching nothing.
TEST(CudaGraphReplay, AMovedGraphReplaysAndItsOldNameThrows) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  run_ranks(
      1,
      [&](Communicator& comm) {
        OneRank one(comm);
        CudaGraph captured_dispatch(comm.stream(), [&] { one.dispatch(); });
        CudaGraph captured_combine(comm.stream(), [&] { one.combine(); });
        CudaGraph dispatch_graph(std::move(captured_dispatch));
        CudaGraph combine_graph(comm.stream(), [] {});  // an empty graph, dropped by the assignment
        combine_graph = std::move(captured_combine);
        for (int replay = 0; replay < 2; ++replay)
          EXPECT_EQ(one.round([&] { dispatch_graph.replay(); }, [&] { combine_graph.replay(); }),
                    "")
              << "replay " << replay;
        for (CudaGraph* moved_from : {&captured_dispatch, &captured_combine}) {
          const std::string error = error_of([&] { moved_from->replay(); });
          EXPECT_NE(error.find("CudaGraph::replay: this graph was moved from"), std::string::npos)
              << error;
        }
      },
      Device::cuda(0));
}

}  // namespace
}  // namespace pmoe::testing
