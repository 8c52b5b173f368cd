// AllToAll's launches on the CUDA backend, W ranks sharing one GPU: dispatch and combine captured
// once into CUDA graphs and replayed 100 times with new routing and m (one node; emulated device:
// two nodes, direct and hierarchical), checked against the reference; replays out of order or
// with another m raise errors on every rank; and (emulated device) the kernels each step launches.
// Built twice: for the emulated device (runs everywhere) and for a GPU
// (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdlib>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "all_to_all_cases.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {
namespace {

using reference::Routing;

// Dispatch and combine captured once per rank into two CUDA graphs, then replayed 100 times with
// new routing and a new m written into device memory before each replay. Between the two graphs
// the host runs the reference's stand-in experts (a different function per expert, so a row
// combined from the wrong slot shows), and both outputs are checked against the reference.
// per_node: 0 on one node; 2 as two nodes of two ranks (off-node peers through the remote path),
// crossed as `cross_node` says.
void graph_replays(int per_node, CrossNode cross_node = CrossNode::direct) {
  const int W = 4, max_tokens = 16, H = 128, k = 3;
  constexpr uint8_t kSentinel = 0xA5;
  AllToAllConfig cfg = make_config(max_tokens, 2 * W, k, H, DType::bf16, DType::bf16);
  cfg.ranks_per_node = per_node;
  cfg.cross_node = cross_node;
  std::vector<std::string> errors(W);
  run_ranks(W, [&](Communicator& comm) {
    const int rank = comm.rank(), L = cfg.num_experts / W, rows = W * max_tokens;
    const Device gpu = comm.device();
    auto stream = static_cast<cudaStream_t>(comm.stream().handle);
    std::string& error = errors[size_t(rank)];
    auto expect_cuda = [&](cudaError_t status, const char* what) {
      if (status != cudaSuccess && error.empty())
        error = detail::cat(what, ": ", cudaGetErrorString(status));
    };
    AllToAll a2a(comm, cfg);
    Buffer x(DType::bf16, {max_tokens, H}, gpu), indices(DType::i32, {max_tokens, k}, gpu),
        weights(DType::f32, {max_tokens, k}, gpu), counts(DType::i32, {L}, gpu),
        expert_x(DType::bf16, {L, rows, H}, gpu), expert_y(DType::bf16, {L, rows, H}, gpu),
        y(DType::bf16, {max_tokens, H}, gpu), bound_m(DType::i32, {1}, gpu);
    Buffer host_counts(DType::i32, {L}), host_expert_x(DType::bf16, {L, rows, H}),
        host_expert_y(DType::bf16, {L, rows, H});
    cudaGraph_t dispatch_graph = nullptr, combine_graph = nullptr;
    cudaGraphExec_t dispatch_exec = nullptr, combine_exec = nullptr;
    comm.barrier();
    expect_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
    a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor(), Phase::both, bound_m);
    expect_cuda(cudaStreamEndCapture(stream, &dispatch_graph), "end capture");
    expect_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
    a2a.combine(expert_y, indices, weights, y, Phase::both, bound_m);
    expect_cuda(cudaStreamEndCapture(stream, &combine_graph), "end capture");
    expect_cuda(cudaGraphInstantiate(&dispatch_exec, dispatch_graph, 0), "instantiate");
    expect_cuda(cudaGraphInstantiate(&combine_exec, combine_graph, 0), "instantiate");
    auto note_kernel_errors = [&] {
      if (!error.empty()) return;
      try {
        a2a.check_errors();
      } catch (const Error& e) {
        error = e.what();
      }
    };
    // Every rank replays every time, even after a failure: peers would wait for it otherwise.
    const bool captured = error.empty();
    for (int replay = 0; replay < 100; ++replay) {
      // Every rank builds every rank's inputs for this replay, then uploads its own.
      std::vector<reference::AllToAllInputs> all;
      for (int r = 0; r < W; ++r)
        all.push_back(reference::make_inputs(cfg, r, 1 + (replay * 7 + r * 3) % max_tokens,
                                             uint64_t(replay), Routing::dropped));
      const auto& mine = all[size_t(rank)];
      const int32_t m = mine.m;
      const Tensor x_rows(x.data<void>(), DType::bf16, {m, H}, gpu),
          indices_rows(indices.data<void>(), DType::i32, {m, k}, gpu),
          weights_rows(weights.data<void>(), DType::f32, {m, k}, gpu),
          y_rows(y.data<void>(), DType::bf16, {m, H}, gpu);
      copy(x_rows, mine.x);
      copy(indices_rows, mine.indices);
      copy(weights_rows, mine.weights);
      copy(bound_m, Tensor(const_cast<int32_t*>(&m), DType::i32, {1}));
      expect_cuda(cudaMemsetAsync(expert_x.data<void>(), kSentinel, expert_x.nbytes(), stream),
                  "memset");
      expect_cuda(cudaStreamSynchronize(stream), "sync");
      comm.barrier();  // every rank's inputs are in place before any replay reads a peer's
      if (captured) expect_cuda(cudaGraphLaunch(dispatch_exec, stream), "launch dispatch");
      expect_cuda(cudaStreamSynchronize(stream), "sync");
      copy(host_counts, counts);
      copy(host_expert_x, expert_x);
      note_kernel_errors();
      if (error.empty()) {
        const std::string wrong = reference::compare_dispatch(
            cfg, W, reference::reference_dispatch(cfg, W, rank, all), host_counts,
            host_expert_x, Tensor(), kSentinel);
        if (!wrong.empty()) error = detail::cat("replay ", replay, ": ", wrong);
      }
      if (error.empty())  // counts from a failed dispatch may not be counts
        reference::run_fake_experts(cfg, W, rank, host_counts, host_expert_x, Tensor(),
                                    host_expert_y);
      copy(expert_y, host_expert_y);
      if (captured) expect_cuda(cudaGraphLaunch(combine_exec, stream), "launch combine");
      expect_cuda(cudaStreamSynchronize(stream), "sync");
      note_kernel_errors();
      if (error.empty()) {
        Buffer host_y(DType::bf16, {m, H});
        copy(host_y, y_rows);
        const std::string wrong = reference::compare_bytes(
            "combine y", host_y, reference::reference_combine(cfg, mine, DType::bf16));
        if (!wrong.empty()) error = detail::cat("replay ", replay, ": ", wrong);
      }
      comm.barrier();  // nobody rewrites its inputs while a peer's replay may still read them
    }
    for (cudaGraphExec_t exec : {dispatch_exec, combine_exec})
      if (exec) cudaGraphExecDestroy(exec);
    for (cudaGraph_t graph : {dispatch_graph, combine_graph})
      if (graph) cudaGraphDestroy(graph);
  }, Device::cuda(0));
  for (int r = 0; r < W; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

TEST(AllToAllCuda, GraphReplaysWithChangingRoutingAndM) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  graph_replays(0);
}

#if !defined(PMOE_TEST_ON_GPU)
TEST(AllToAllCuda, GraphReplaysAcrossTwoNodesWithChangingRoutingAndM) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  graph_replays(2);
}

TEST(AllToAllCuda, GraphReplaysAcrossTwoNodesHierarchical) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  graph_replays(2, CrossNode::hierarchical);
}
#endif

#if !defined(PMOE_TEST_ON_GPU)
// Kernels per step, counted on the emulated device (docs/gpu-all-to-all.md): dispatch(send) 1,
// dispatch(recv) 2, combine(send) 1, combine(recv) 2 (it was 2, 2, 1, 2), and 2 for each op in
// Phase::both (it was 4 and 3), at 1 and 3 ranks.
TEST(AllToAllCuda, KernelsPerStep) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  for (int W : {1, 3}) {
    const AllToAllConfig cfg = make_config(5, 2 * W, std::min(2, 2 * W), 48, DType::bf16, DType::f32);
    std::vector<std::string> errors(static_cast<size_t>(W));
    run_ranks(W, [&](Communicator& comm) {
      const int rank = comm.rank(), L = cfg.num_experts / W, rows = W * 5;
      const Device gpu = comm.device();
      const auto in = reference::make_inputs(cfg, rank, 5, 9, Routing::random);
      auto [x, indices, weights] = inputs_on(in, gpu);
      Buffer counts(DType::i32, {L}, gpu), expert_x(DType::bf16, {L, rows, 48}, gpu),
          expert_y(DType::bf16, {L, rows, 48}, gpu), y(DType::f32, {5, 48}, gpu);
      AllToAll a2a(comm, cfg);
      std::string counted;
      auto step = [&](const char* name, const std::function<void()>& call) {
        const uint64_t before = emu::kernels_launched_by_this_thread();
        call();
        counted += detail::cat(name, " ", emu::kernels_launched_by_this_thread() - before, "; ");
      };
      step("dispatch(send)", [&] {
        a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor(), Phase::send);
      });
      step("dispatch(recv)", [&] {
        a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor(), Phase::recv);
      });
      step("combine(send)", [&] { a2a.combine(expert_y, indices, weights, y, Phase::send); });
      step("combine(recv)", [&] { a2a.combine(expert_y, indices, weights, y, Phase::recv); });
      step("dispatch", [&] { a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor()); });
      step("combine", [&] { a2a.combine(expert_y, indices, weights, y); });
      synchronize(comm.stream());
      a2a.check_errors();
      if (counted != "dispatch(send) 1; dispatch(recv) 2; combine(send) 1; combine(recv) 2; "
                     "dispatch 2; combine 2; ")
        errors[size_t(rank)] = counted;
    }, Device::cuda(0));
    for (int r = 0; r < W; ++r) EXPECT_EQ(errors[size_t(r)], "") << "W = " << W << ", rank " << r;
  }
}
#endif

// Graph replays skip the host's phase and m checks, so the device keeps its own: dispatch
// records the step and m it ran, combine checks them. Three scripts of replays of one captured
// dispatch graph (d) and combine graph (c), each on a fresh op, every rank alike:
//   d c with bound_m 3 then 5: combine would read rows 3 and 4 that no dispatch sent (stale);
//   d c c: the second combine reads rows nobody sent again;
//   d d: a dispatch before the combine of the last one.
// Each must raise a clear error from check_errors() on every rank, and nothing may hang.
TEST(AllToAllCuda, GraphReplaysOutOfOrderOrWithAnotherMAreErrors) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  setenv("PMOE_TIMEOUT_S", "5", 1);
  const int W = 2, max_tokens = 6, H = 32, k = 2;
  const AllToAllConfig cfg = make_config(max_tokens, 2 * W, k, H, DType::bf16, DType::bf16);
  struct Script {
    const char* steps;
    int32_t dispatch_m, combine_m;
    const char* expected;  // in the error every rank raises
  };
  const Script scripts[] = {
      {"dc", 3, 5, "combine's m = 5 differs from the m = 3 of the dispatch it follows"},
      {"dcc", 4, 4, "the device ran combine(send) where it expected dispatch(send)"},
      {"dd", 4, 4, "the device ran dispatch(send) where it expected combine(send)"},
  };
  std::vector<std::vector<std::string>> raised(std::size(scripts), std::vector<std::string>(W));
  run_ranks(W, [&](Communicator& comm) {
    const int rank = comm.rank(), L = cfg.num_experts / W, rows = W * max_tokens;
    const Device gpu = comm.device();
    auto stream = static_cast<cudaStream_t>(comm.stream().handle);
    const auto in = reference::make_inputs(cfg, rank, max_tokens, 5, Routing::random);
    auto [x, indices, weights] = inputs_on(in, gpu);
    Buffer bound_m(DType::i32, {1}, gpu);
    Buffer counts(DType::i32, {L}, gpu), expert_x(DType::bf16, {L, rows, H}, gpu),
        expert_y(DType::bf16, {L, rows, H}, gpu), y(DType::bf16, {max_tokens, H}, gpu);
    for (size_t s = 0; s < std::size(scripts); ++s) {
      const Script& script = scripts[s];
      AllToAll a2a(comm, cfg);
      cudaGraph_t graphs[2] = {};
      cudaGraphExec_t execs[2] = {};
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
      a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor(), Phase::both, bound_m);
      cudaStreamEndCapture(stream, &graphs[0]);
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
      a2a.combine(expert_y, indices, weights, y, Phase::both, bound_m);
      cudaStreamEndCapture(stream, &graphs[1]);
      for (int g = 0; g < 2; ++g) cudaGraphInstantiate(&execs[g], graphs[g], 0);
      for (const char* step = script.steps; *step; ++step) {
        const bool dispatch = *step == 'd';
        const int32_t m = dispatch ? script.dispatch_m : script.combine_m;
        copy(bound_m, Tensor(const_cast<int32_t*>(&m), DType::i32, {1}));
        comm.barrier();
        cudaGraphLaunch(execs[dispatch ? 0 : 1], stream);
        cudaStreamSynchronize(stream);
      }
      try {
        a2a.check_errors();
      } catch (const Error& e) {
        raised[s][size_t(rank)] = e.what();
      }
      for (int g = 0; g < 2; ++g) {
        if (execs[g]) cudaGraphExecDestroy(execs[g]);
        if (graphs[g]) cudaGraphDestroy(graphs[g]);
      }
      comm.barrier();
    }
  }, Device::cuda(0));
  unsetenv("PMOE_TIMEOUT_S");
  for (size_t s = 0; s < std::size(scripts); ++s)
    for (int r = 0; r < W; ++r)
      EXPECT_NE(raised[s][size_t(r)].find(scripts[s].expected), std::string::npos)
          << "script " << scripts[s].steps << ", rank " << r << " raised: " << raised[s][size_t(r)];
}

}  // namespace
}  // namespace pmoe::testing
