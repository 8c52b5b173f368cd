// AllToAll on the CUDA backend: the CPU tests' cases with W ranks sharing one GPU, checked
// against the same reference, so the two backends give the same bytes; a CUDA graph captured
// once and replayed with new routing and m; a peer that never arrives, named by the kernels.
// Built twice: for the emulated device (runs everywhere) and for a GPU (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "all_to_all_cases.hpp"
#include "all_to_all_mask_cases.hpp"
#include "core/device_runtime.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {
namespace {

using reference::Routing;

void expect_case_on_gpu(int W, AllToAllCase c) {
  c.device = Device::cuda(0);
  std::vector<CaseResult> results(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) { results[size_t(comm.rank())] = run_all_to_all_case(comm, c); },
            Device::cuda(0));
  uint64_t remote = 0;
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(results[size_t(r)].error, "") << "W = " << W;
    remote += results[size_t(r)].remote_bytes;
  }
  // A split world: off-node peers have no pointer, so the bytes must have gone through the
  // remote path (the emulated proxy) or the case could not have matched.
  const int per_node = c.config.ranks_per_node;
  if (per_node > 0 && per_node < W) {
    EXPECT_GT(remote, 0u) << "nothing went through the remote path";
  }
}

// Ranks, and ranks per node (0: one node; otherwise the world as nodes x ranks, off-node peers
// reached through the device transport's remote path only).
struct Topology {
  int ranks, per_node;
  CrossNode cross_node = CrossNode::direct;  // how a split world's nodes are crossed
};
void PrintTo(const Topology& t, std::ostream* out) {
  *out << t.ranks << " ranks, " << t.per_node << " per node"
       << (t.cross_node == CrossNode::hierarchical ? ", hierarchical" : "");
}

class AllToAllCuda : public ::testing::TestWithParam<Topology> {
 protected:
  void SetUp() override { PMOE_REQUIRE_CUDA_RUNTIME(); }
  int W() const { return GetParam().ranks; }
  AllToAllCase base(int top_k = 3, int hidden = 64) const {
    AllToAllCase c;
    c.config = make_config(9, 2 * W(), std::min(top_k, 2 * W()), hidden);
    c.config.ranks_per_node = GetParam().per_node;
    c.config.cross_node = GetParam().cross_node;
    c.calls = 3;
    return c;
  }
  // f8e4m3 tokens with 128-element block scales, expert outputs in bf16.
  static AllToAllCase with_f8(AllToAllCase c) {
    c.config.in_dtype = DType::f8e4m3;
    c.config.scale_block = 128;
    c.expert_y_dtype = DType::bf16;
    return c;
  }
};

TEST_P(AllToAllCuda, RandomRoutingEveryDtype) {
  for (DType in : {DType::f32, DType::bf16, DType::f16}) {
    for (DType out : {DType::f32, DType::bf16, DType::f16}) {
      AllToAllCase c = base();
      c.config.in_dtype = in;
      c.config.out_dtype = out;
      c.expert_y_dtype = in;
      expect_case_on_gpu(W(), c);
    }
  }
}

TEST_P(AllToAllCuda, F8WithBlockScales) {
  expect_case_on_gpu(W(), with_f8(base(3, 256)));
}

TEST_P(AllToAllCuda, EdgeCases) {
  AllToAllCase zero = base();
  zero.tokens = TokenCounts::zero_on_odd;
  expect_case_on_gpu(W(), zero);
  AllToAllCase hot = base();
  hot.routing = Routing::hot_expert;
  hot.tokens = TokenCounts::full;
  expect_case_on_gpu(W(), hot);
  AllToAllCase dropped = base();
  dropped.routing = Routing::dropped;
  expect_case_on_gpu(W(), dropped);
  AllToAllCase all_experts = base();
  all_experts.config.experts_per_token = all_experts.config.num_experts;
  expect_case_on_gpu(W(), all_experts);
  AllToAllCase odd = base(2, 7);  // rows that are not a multiple of 16 bytes
  odd.config.in_dtype = DType::f16;
  odd.expert_y_dtype = DType::f16;
  expect_case_on_gpu(W(), odd);
  // f8 rows of 9 bytes with 3 scales each: rows and scale blocks at every byte alignment, so the
  // copies take their byte and narrow-word paths (a 16-byte access there traps: emulated-device.md)
  AllToAllCase odd_f8 = with_f8(base(2, 9));
  odd_f8.config.scale_block = 3;
  odd_f8.calls = 1;
  expect_case_on_gpu(W(), odd_f8);
}

// Odd hidden sizes in every dtype pair the combine reads and writes: rows whose vector body and
// scalar tail meet inside one row, at every alignment the pairs give.
TEST_P(AllToAllCuda, OddHiddenSizesEveryDtypePair) {
  for (int hidden : {9, 13}) {
    for (DType in : {DType::f32, DType::bf16}) {
      for (DType out : {DType::f32, DType::bf16, DType::f16}) {
        AllToAllCase c = base(2, hidden);
        c.config.in_dtype = in;
        c.config.out_dtype = out;
        c.expert_y_dtype = in;
        c.calls = 1;
        expect_case_on_gpu(W(), c);
      }
    }
  }
}

// More experts than send_tokens counts in __shared__ at once (2048 a pass): 2056 local experts a
// rank, so its routing takes two passes at W = 1 and up to nine at W = 8; every token chooses the
// last expert, in the last pass, so its rows' positions there count tokens of other blocks.
TEST_P(AllToAllCuda, MoreLocalExpertsThanOneRankingPass) {
  AllToAllCase c = base(4, 32);
  c.config.num_experts = 2056 * W();
  c.routing = Routing::hot_last_expert;
  c.calls = 2;
  expect_case_on_gpu(W(), c);
}

// More tokens and routes than the kernels have blocks (2 per SM), and rows longer than a block's
// threads, so every grid-stride and block-stride loop runs more than once; f8 rows with 3 scales
// (12 bytes: the scales take the byte-wise copy).
TEST_P(AllToAllCuda, MoreWorkThanBlocks) {
  AllToAllCase wide = base(4, 1032);
  wide.config.max_num_tokens = 300;
  wide.tokens = TokenCounts::full;
  wide.calls = 2;
  expect_case_on_gpu(W(), wide);
  AllToAllCase f8 = with_f8(base(3, 384));
  f8.config.max_num_tokens = 300;
  expect_case_on_gpu(W(), f8);
}

TEST_P(AllToAllCuda, SplitPhasesAndManyCalls) {
  AllToAllCase c = base();
  c.split_phases = true;
  c.calls = 50;
  expect_case_on_gpu(W(), c);
}

// torch.topk's int64 indices, narrowed on the device: the same results as int32, whole and split.
TEST_P(AllToAllCuda, Int64Indices) {
  AllToAllCase c = base();
  c.routing = Routing::dropped;
  c.i64_indices = true;
  expect_case_on_gpu(W(), c);
  c.split_phases = true;
  expect_case_on_gpu(W(), c);
  // More indices (1100 x top-k >= 2200) than the narrowing kernel's grid has threads (8 x 256).
  AllToAllCase many = base(4, 16);
  many.config.max_num_tokens = 1100;
  many.tokens = TokenCounts::full;
  many.i64_indices = true;
  many.calls = 1;
  expect_case_on_gpu(W(), many);
}

// The node splits run on the emulated device only: there the off-node peers go through its proxy.
// On a GPU the ranks of a test share that one GPU, and NCCL gives GIN one rank of a communicator
// per GPU, so a split is refused (OnOneGpuANodeSplitIsRefusedByName); scripts/device_checks.sh's
// gin part runs the remote path across processes instead.
INSTANTIATE_TEST_SUITE_P(Ranks, AllToAllCuda,
                         ::testing::Values(Topology{1, 0}, Topology{2, 0}, Topology{4, 0},
                                           Topology{8, 0}
#if !defined(PMOE_TEST_ON_GPU)
                                           , Topology{4, 2}, Topology{8, 4}, Topology{8, 2},
                                           Topology{4, 2, CrossNode::hierarchical},
                                           Topology{8, 4, CrossNode::hierarchical},
                                           Topology{8, 2, CrossNode::hierarchical}
#endif
                                           ),
                         [](const auto& info) {
                           const Topology t = info.param;
                           if (t.per_node == 0) return "W" + std::to_string(t.ranks);
                           return "Nodes" + std::to_string(t.ranks / t.per_node) + "x" +
                                  std::to_string(t.per_node) +
                                  (t.cross_node == CrossNode::hierarchical ? "_hierarchical"
                                                                           : "");
                         });

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

#if !defined(PMOE_TEST_ON_GPU)
// Node-summed combine (combine_sums_in_node) on the emulated 2x2, 2x4 and 4x2 splits: each case
// within the bound derived in tests/all_to_all_cases.cpp (compare_node_summed), in bf16, f32 and
// f16 expert outputs; the same bytes on a second run; the edges (no tokens on odd ranks, -1
// slots, top-k = E, odd rows) and split phases. Its network bytes: test_cuda_all_to_all_traffic.
class NodeSummedCombine : public ::testing::TestWithParam<Topology> {
 protected:
  void SetUp() override { PMOE_REQUIRE_CUDA_RUNTIME(); }
  AllToAllCase base(int top_k = 3, int hidden = 64) const {
    const int W = GetParam().ranks;
    AllToAllCase c;
    c.config = make_config(9, 2 * W, std::min(top_k, 2 * W), hidden);
    c.config.ranks_per_node = GetParam().per_node;
    c.config.cross_node = CrossNode::hierarchical;
    c.config.combine_sums_in_node = true;
    c.calls = 2;
    c.device = Device::cuda(0);
    return c;
  }
  // The case's digest (every output byte of every call), after expecting it to pass.
  uint64_t run(const AllToAllCase& c) const {
    const int W = GetParam().ranks;
    std::vector<CaseResult> results(static_cast<size_t>(W));
    run_ranks(W, [&](Communicator& comm) {
      results[size_t(comm.rank())] = run_all_to_all_case(comm, c);
    }, Device::cuda(0));
    uint64_t digest = 0;
    for (int r = 0; r < W; ++r) {
      EXPECT_EQ(results[size_t(r)].error, "") << describe(c);
      EXPECT_GT(results[size_t(r)].remote_bytes, 0u) << "rank " << r << " sent nothing off-node";
      digest = digest * 31 + results[size_t(r)].digest;
    }
    return digest;
  }
};

TEST_P(NodeSummedCombine, WithinTheBoundAndTheSameBitsEveryRun) {
  AllToAllCase c = base(4);
  for (DType expert_y : {DType::bf16, DType::f32, DType::f16}) {
    c.config.in_dtype = expert_y == DType::f32 ? DType::f32 : DType::bf16;
    c.config.out_dtype = expert_y == DType::bf16 ? DType::bf16 : DType::f32;
    c.expert_y_dtype = expert_y;
    SCOPED_TRACE(dtype_name(expert_y));
    EXPECT_EQ(run(c), run(c)) << "two runs of the same case differ";
  }
}

TEST_P(NodeSummedCombine, EdgeCases) {
  AllToAllCase zero = base();
  zero.tokens = TokenCounts::zero_on_odd;
  run(zero);
  AllToAllCase dropped = base();
  dropped.routing = Routing::dropped;
  run(dropped);
  AllToAllCase all_experts = base();
  all_experts.config.experts_per_token = all_experts.config.num_experts;
  all_experts.tokens = TokenCounts::full;
  run(all_experts);
  AllToAllCase odd = base(2, 7);  // rows that are not a multiple of 16 bytes: the scalar path
  odd.config.out_dtype = DType::f16;
  run(odd);
  AllToAllCase split = base();
  split.split_phases = true;
  split.calls = 4;
  run(split);
}

INSTANTIATE_TEST_SUITE_P(Splits, NodeSummedCombine,
                         ::testing::Values(Topology{4, 2}, Topology{8, 4}, Topology{8, 2}),
                         [](const auto& info) {
                           const Topology t = info.param;
                           return "Nodes" + std::to_string(t.ranks / t.per_node) + "x" +
                                  std::to_string(t.per_node);
                         });

// The option without hierarchical mode is refused at construction, on every rank, before
// anything is allocated.
TEST(NodeSummedCombineConfig, WithoutHierarchicalModeIsAnError) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  std::vector<std::string> errors(2);
  run_ranks(2, [&](Communicator& comm) {
    AllToAllConfig cfg = make_config(4, 4, 2, 32);
    cfg.ranks_per_node = 1;
    cfg.combine_sums_in_node = true;
    try {
      AllToAll a2a(comm, cfg);
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  }, Device::cuda(0));
  for (const std::string& e : errors)
    EXPECT_NE(e.find("combine_sums_in_node is an option of cross_node = hierarchical"),
              std::string::npos)
        << e;
}

// Two nodes of two; rank 3 dispatches but never combines. Rank 1, rank 3's relay on node 0,
// waits for rank 3's weights to sum node 0's rows for it: after the timeout it names rank 3,
// its node, and what it waited for; rank 0 names its relay on node 1, rank 2, which waited for
// rank 3's rows in vain.
TEST(NodeSummedCombineConfig, RelayWithoutASourcesWeightsTimesOutNamingIt) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  setenv("PMOE_TIMEOUT_S", "1", 1);
  std::vector<std::string> errors(4);
  run_ranks(4, [&](Communicator& comm) {
    AllToAllConfig cfg = make_config(4, 8, 2, 32);
    cfg.ranks_per_node = 2;
    cfg.cross_node = CrossNode::hierarchical;
    cfg.combine_sums_in_node = true;
    AllToAll a2a(comm, cfg);
    const auto in = reference::make_inputs(cfg, comm.rank(), 4, 3, Routing::random);
    const Device gpu = comm.device();
    auto [x, indices, weights] = inputs_on(in, gpu);
    Buffer counts(DType::i32, {2}, gpu), expert_x(DType::bf16, {2, 16, 32}, gpu),
        y(DType::bf16, {in.m, 32}, gpu);
    try {
      a2a.dispatch(x, Tensor(), indices, counts, expert_x, Tensor());
      synchronize(comm.stream());
      a2a.check_errors();
      comm.barrier();  // every dispatch is over: only combine's waits can fail below
      if (comm.rank() == 3) return;
      a2a.combine(expert_x, indices, weights, y);
      synchronize(comm.stream());
      a2a.check_errors();
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  }, Device::cuda(0));
  unsetenv("PMOE_TIMEOUT_S");
  EXPECT_NE(errors[1].find("rank 3 (node 1; this rank is on node 0) did not arrive within 1 s"),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[1].find("this rank waited for the weights of its tokens, to sum node 0's rows "
                           "of them"),
            std::string::npos)
      << errors[1];
  // Rank 2, rank 0's relay on node 1, never gets rank 3's rows, so rank 0 never gets node 1's
  // partial sums of its tokens: it names rank 2 and what it waited for.
  EXPECT_NE(errors[0].find("rank 2 (node 1; this rank is on node 0) did not arrive within 1 s; "
                           "this rank waited for node 1's partial sums of its tokens"),
            std::string::npos)
      << errors[0];
}
#endif

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

// Placements and masked ranks with the ranks sharing a GPU: the kernels route indices to live
// slots from the table in device memory and wait for live ranks only (the CPU's cases, the same
// reference).
void expect_mask_case_on_gpu(int W, const MaskCase& c) { expect_mask_case(W, c, Device::cuda(0)); }

MaskCase mask_case(int W) {
  MaskCase c;
  c.config = make_config(/*max_tokens=*/7, /*experts=*/4 * W, /*top_k=*/3, /*hidden=*/40);
  c.config.rank_mask = true;
  return c;
}

TEST(AllToAllCudaMask, ReplicasLoseNoTokenWhenARankStops) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  for (bool split : {false, true}) {
    MaskCase c = mask_case(4);
    c.config.placement = ExpertPlacement::round_robin(8, 16);
    c.stops = {{3, 2}};
    c.split_phases = split;
    expect_mask_case_on_gpu(4, c);
  }
}

TEST(AllToAllCudaMask, WithoutReplicasTheExpertsOfStoppedRanksAreDropped) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  for (MaskedExperts rule : {MaskedExperts::drop, MaskedExperts::renormalize}) {
    MaskCase c = mask_case(4);
    c.config.masked_experts = rule;
    c.calls = 6;
    c.stops = {{1, 1}, {2, 3}};
    expect_mask_case_on_gpu(4, c);
  }
}

// The graphs are captured before the mask; replays read it (and the routing table) from device
// memory, so the ranks that go on need no new capture.
TEST(AllToAllCudaMask, ACapturedGraphFollowsTheMask) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  for (bool replicas : {true, false}) {
    MaskCase c = mask_case(4);
    if (replicas) c.config.placement = ExpertPlacement::round_robin(8, 16);
    c.config.masked_experts = MaskedExperts::renormalize;
    c.calls = 6;
    c.stops = {{2, 2}, {1, 4}};
    c.graph = true;
    expect_mask_case_on_gpu(4, c);
  }
}

TEST(AllToAllCudaMask, ReplicasSpreadTokensWithoutAMask) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  MaskCase c = mask_case(2);
  c.config.rank_mask = false;
  c.config.placement = ExpertPlacement::round_robin(4, 8);
  expect_mask_case_on_gpu(2, c);
}

}  // namespace
}  // namespace pmoe::testing
