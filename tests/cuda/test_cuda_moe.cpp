// The MoE layers on one CUDA device shared by W thread ranks (W in {1, 2, 3, 4}), each rank with
// its own stream: SimpleMoe, TpMoe and EpMoe against the plain reference and against the CPU
// backend, every activation, f32 and bf16, uneven expert loads, ranks with no tokens, output
// width != feature width, many calls on one layer; bad input named before any kernel runs.
// Built for the emulated device and for a GPU (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

// After the standard headers: the emulated device's defines qualifiers such as __noinline__.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "cpu/gemm.hpp"
#include "cuda/gemm/expert_tiles.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "moe_cases.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::testing {
namespace {

constexpr Activation kActivations[] = {Activation::relu, Activation::gelu, Activation::swiglu};

// Runs `c` on W thread ranks of `device`; every rank must match the reference. Returns each
// rank's result (its output and stats of the last call).
std::vector<MoeCaseResult> expect_case(MoeCase c, int W, Device device) {
  cpu::set_blas_threads(1);  // thread ranks call BLAS at once (the CPU layers and cuBLAS's shim)
  c.device = device;
  std::vector<MoeCaseResult> results(static_cast<size_t>(W));
  run_ranks(
      W, [&](Communicator& comm) { results[size_t(comm.rank())] = run_moe_case(comm, c); }, device);
  int compared = 0;
  for (const MoeCaseResult& r : results) {
    EXPECT_EQ(r.error, "") << describe(c, W);
    compared += r.compared;
  }
  if (c.batch > 0) {
    EXPECT_GT(compared, 0) << describe(c, W);
  }
  return results;
}

// The case on the device, then on the CPU: both match the reference, and each other within the
// dtype's tolerance (relative to the largest output).
void expect_device_matches_cpu(const MoeCase& c, int W) {
  const auto device = expect_case(c, W, Device::cuda(0));
  const auto cpu = expect_case(c, W, Device::cpu());
  ASSERT_EQ(device.size(), cpu.size());
  for (size_t r = 0; r < cpu.size(); ++r) {
    const std::vector<float>&on_device = device[r].y, &on_cpu = cpu[r].y;
    ASSERT_EQ(on_device.size(), on_cpu.size()) << describe(c, W);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < on_cpu.size(); ++i) {
      worst = std::max(worst, double(std::abs(on_device[i] - on_cpu[i])));
      scale = std::max(scale, double(std::abs(on_cpu[i])));
    }
    EXPECT_LE(worst, reference::moe_tolerance(c.config.dtype) * scale)
        << describe(c, W) << " rank " << r;
  }
}

MoeCase base_case(MoeVariant v, int W, Activation act, DType dtype) {
  MoeCase c;
  // Two experts per rank; ffn divisible by 1..4 for TP; a batch no W > 1 divides.
  c.config =
      make_moe_config(/*feature=*/24, /*ffn=*/36, /*experts=*/2 * W, /*top_k=*/2, act, dtype);
  c.variant = v;
  c.batch = 4 * W + 3;
  return c;
}

class MoeCuda : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { PMOE_REQUIRE_CUDA_RUNTIME(); }
};

TEST_P(MoeCuda, SimpleMatchesReferenceAndCpu) {
  const int W = GetParam();
  for (Activation act : kActivations)
    for (DType dtype : {DType::f32, DType::bf16})
      expect_device_matches_cpu(base_case(MoeVariant::simple, W, act, dtype), W);
}

// Every rank's output has the same bits (run_moe_case checks it for TP).
TEST_P(MoeCuda, TpMatchesReferenceAndCpu) {
  const int W = GetParam();
  for (Activation act : kActivations)
    for (DType dtype : {DType::f32, DType::bf16})
      expect_device_matches_cpu(base_case(MoeVariant::tp, W, act, dtype), W);
  MoeCase many = base_case(MoeVariant::tp, W, Activation::swiglu, DType::bf16);
  many.config.num_experts = 5 * W;
  many.config.top_k = 3;
  many.calls = 12;  // 11, 10, 9, ... tokens: the done words guard the regions' reuse
  expect_device_matches_cpu(many, W);
}

TEST_P(MoeCuda, EpMatchesReferenceAndCpu) {
  const int W = GetParam();
  for (int mb : {1, 2})
    for (Activation act : kActivations)
      for (DType dtype : {DType::f32, DType::bf16}) {
        MoeCase c = base_case(MoeVariant::ep, W, act, dtype);
        c.micro_batches = mb;
        expect_device_matches_cpu(c, W);
      }
}

// A placement with two replicas of every expert (on one rank both on it; else on other ranks):
// the device layer matches the reference and the CPU layer, whichever replica a token reaches.
TEST_P(MoeCuda, EpWithReplicasMatchesReferenceAndCpu) {
  const int W = GetParam();
  for (int mb : {1, 2}) {
    MoeCase c = base_case(MoeVariant::ep, W, Activation::swiglu, DType::bf16);
    c.micro_batches = mb;
    c.placement = ExpertPlacement::round_robin(c.config.num_experts, 2 * c.config.num_experts);
    expect_device_matches_cpu(c, W);
  }
}

// Uneven expert loads: one token's worth of routing skewed by a batch of 1-3 tokens on W ranks
// (ranks with none), 1 and 5 experts per rank, top-k = E, 12 calls on one layer (buffers and
// epochs reused, m changing).
TEST_P(MoeCuda, EpUnevenLoadsAndEmptyRanks) {
  const int W = GetParam();
  for (int mb : {1, 2}) {
    MoeCase tiny = base_case(MoeVariant::ep, W, Activation::relu, DType::bf16);
    tiny.micro_batches = mb;
    tiny.batch = 2;  // calls run 2, 1, 0, 2, ... tokens
    tiny.calls = 6;
    expect_case(tiny, W, Device::cuda(0));
    for (int per_rank : {1, 5}) {
      MoeCase c = base_case(MoeVariant::ep, W, Activation::swiglu, DType::f32);
      c.micro_batches = mb;
      c.config.num_experts = W * per_rank;
      c.config.top_k = std::min(3, c.config.num_experts);
      c.calls = 12;
      expect_device_matches_cpu(c, W);
    }
    MoeCase all = base_case(MoeVariant::ep, W, Activation::gelu, DType::f32);
    all.micro_batches = mb;
    all.config.top_k = all.config.num_experts;
    expect_device_matches_cpu(all, W);
  }
}

// EpMoe's bytes_moved on the device is counted by a kernel with the CPU layer's rule: the same
// routing gives each rank the same figure on both backends, nonzero once tokens leave their rank.
// The wire is wider than H (O > H) and the last call runs fewer tokens than the first.
TEST_P(MoeCuda, EpBytesMovedEqualsCpu) {
  const int W = GetParam();
  for (int mb : {1, 2}) {
    MoeCase c = base_case(MoeVariant::ep, W, Activation::relu, DType::bf16);
    c.micro_batches = mb;
    c.config.output_dim = 40;
    c.config.device_stats = true;
    c.calls = 2;
    const auto device = expect_case(c, W, Device::cuda(0));
    const auto cpu = expect_case(c, W, Device::cpu());
    for (int r = 0; r < W; ++r) {
      EXPECT_EQ(device[size_t(r)].stats.bytes_moved, cpu[size_t(r)].stats.bytes_moved)
          << describe(c, W) << " rank " << r;
      if (W > 1) {
        EXPECT_GT(cpu[size_t(r)].stats.bytes_moved, 0) << describe(c, W) << " rank " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(W, MoeCuda, ::testing::Values(1, 2, 3, 4));

// Shapes the base case does not reach, on 4 ranks: output width above and below the feature
// width, top-k = E, and batches of 2, 1 and 0 tokens (ranks with none).
TEST(MoeCudaShapes, OutputWidthDiffersFromFeatureWidth) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  for (int out : {64, 16})
    for (MoeVariant v : {MoeVariant::simple, MoeVariant::tp, MoeVariant::ep})
      for (int mb : {1, 2}) {
        if (v != MoeVariant::ep && mb == 2) continue;
        MoeCase c;
        c.config = make_moe_config(32, 128, 4, 2, Activation::relu, DType::bf16, out);
        c.variant = v;
        c.micro_batches = mb;
        c.batch = 19;
        expect_device_matches_cpu(c, 4);
      }
}

TEST(MoeCudaShapes, SimpleOddShapes) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  MoeCase all = base_case(MoeVariant::simple, 2, Activation::gelu, DType::f32);
  all.config.top_k = all.config.num_experts;
  expect_device_matches_cpu(all, 2);
  for (MoeVariant v : {MoeVariant::simple, MoeVariant::tp}) {
    MoeCase tiny = base_case(v, 4, Activation::relu, DType::f32);
    tiny.batch = 2;  // 2, 1, 0, 2, ... tokens
    tiny.calls = 6;
    expect_case(tiny, 4, Device::cuda(0));
  }
}

// The experts' GEMMs run over tiles of the rows in use (src/cuda/moe/device_experts.hpp), not
// over every slot: SimpleMoe's 64 tokens at top-2 of 8 experts are 128 rows, computed as tiles
// of 16 with at most one partial tile an expert, where every slot would be 8 x 64. EpMoe plans
// for the most a rank can receive, R min(k, E_local) rows, below every slot (E_local R) when
// E_local > k.
TEST(MoeCudaShapes, TiledExpertsComputeTheRowsInUseNotEverySlot) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  MoeCase simple;
  simple.config = make_moe_config(16, 16, 8, 2, Activation::gelu, DType::f32);
  simple.batch = 64;
  const MoeStats s = expect_case(simple, 1, Device::cuda(0))[0].stats;
  EXPECT_GE(s.expert_rows, 64 * 2);
  EXPECT_LE(s.expert_rows, 64 * 2 + 8 * 16);
  MoeCase ep = simple;
  ep.variant = MoeVariant::ep;
  ep.config.top_k = 1;
  ep.micro_batches = 2;
  for (const MoeCaseResult& r : expect_case(ep, 2, Device::cuda(0))) {
    const int64_t R = 2 * 16;  // W x tokens per micro-batch (32 tokens a rank, in two halves)
    EXPECT_LE(r.stats.expert_rows, 2 * (R * 1 + 4 * 16));  // two micro-batches
    EXPECT_LT(r.stats.expert_rows, 2 * 4 * R);
  }
}

// The grouping kernel runs one thread per expert, so only more experts than its grid's 16,384
// threads take its loop round twice, and a skipping stride shows only where a token picks one of
// the experts past the first pass. Of candidate tokens routed by the CPU router, SimpleMoe on the
// device runs the first 8 that pick such an expert, against the reference.
void expect_tokens_of_the_last_experts_grouped() {
  constexpr int kExperts = 16'400, kFirstPass = 64 * 256, kTokens = 8, kCandidates = 500;
  const MoeConfig cfg = make_moe_config(4, 4, kExperts, 2, Activation::relu, DType::f32);
  const int H = cfg.feature_dim, k = cfg.top_k;
  Buffer x(DType::f32, {kTokens, H});
  Router router(cfg);
  int found = 0;
  for (uint64_t seed = 1; seed <= 40 && found < kTokens; ++seed) {
    const Buffer candidates = reference::make_moe_input(cfg, kCandidates, seed);
    Buffer indices(DType::i32, {kCandidates, k}), weights(DType::f32, {kCandidates, k});
    router.route(candidates, indices, weights);
    for (int t = 0; t < kCandidates && found < kTokens; ++t) {
      const int32_t* picked = indices.data<int32_t>() + t * k;
      if (*std::max_element(picked, picked + k) < kFirstPass) continue;
      std::copy_n(candidates.data<float>() + t * H, H, x.data<float>() + found * H);
      ++found;
    }
  }
  ASSERT_EQ(found, kTokens) << "too few candidate tokens pick one of the last experts";
  SimpleMoe layer(cfg, kTokens, Device::cuda(0));
  Buffer x_device(DType::f32, {kTokens, H}, Device::cuda(0));
  Buffer y_device(DType::f32, {kTokens, H}, Device::cuda(0)), y(DType::f32, {kTokens, H});
  copy(x_device, x);
  layer.forward(x_device, y_device);
  synchronize(Stream());
  copy(y, y_device);
  const auto cmp = reference::compare_moe(
      cfg, reference::reference_moe(cfg, x, reference::all_rows(kTokens)), y, 0,
      reference::moe_tolerance(cfg.dtype));
  EXPECT_EQ(cmp.error, "");
  EXPECT_GT(cmp.compared, 0);
}

// More work than one pass of a kernel's grid (moe_kernel_helpers.cuh: at most 64 blocks of 256
// threads, 16,384 threads): 16,500 tokens per rank take the router's loop and every element-wise
// loop round more than once, and 16,400 experts the grouping's, so a stride that skips leaves rows
// the reference sees unset. bf16, so the EP wire's widen and narrow run too, and O != H, so its
// staging copies do.
TEST(MoeCudaShapes, MoreWorkThanOneGridPass) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  constexpr int kTokens = 16'500;
  // EP with O = 12 > H = 8 stages x at the wire width, and with O = 4 < H stages y.
  for (auto [v, out] : {std::pair{MoeVariant::simple, 12}, {MoeVariant::tp, 12},
                        {MoeVariant::ep, 12}, {MoeVariant::ep, 4}}) {
    const int W = v == MoeVariant::simple ? 1 : 2;
    MoeCase c;
    c.config = make_moe_config(8, 8, 4, 2, Activation::swiglu, DType::bf16, out);
    c.variant = v;
    c.micro_batches = v == MoeVariant::ep ? 2 : 1;
    c.batch = v == MoeVariant::ep ? W * kTokens : kTokens;  // EP shards, TP replicates
    expect_case(c, W, Device::cuda(0));
  }
  expect_tokens_of_the_last_experts_grouped();
}

// A tensor on the wrong device, a wrong dtype or shape: named, before anything is launched; the
// layer stays usable.
TEST(MoeCudaInput, BadTensorsAreNamed) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const MoeConfig cfg = make_moe_config(8, 16, 4, 2);
  SimpleMoe layer(cfg, 4, Device::cuda(0));
  Buffer x(DType::f32, {4, 8}, Device::cuda(0)), y(DType::f32, {4, 8}, Device::cuda(0));
  Buffer host_x(DType::f32, {4, 8}), bf16_y(DType::bf16, {4, 8}, Device::cuda(0));
  Buffer short_y(DType::f32, {3, 8}, Device::cuda(0));
  auto expect_error = [&](const Tensor& xa, const Tensor& ya, const std::string& words) {
    try {
      layer.forward(xa, ya);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error(host_x, y, "`x` must be on cuda:0, got cpu");
  expect_error(x, bf16_y, "`y` must be f32");
  expect_error(x, short_y, "`y` must have shape [4, 8]");
  layer.forward(x, y);  // still usable
  synchronize(Stream());
}

// The collective layers: every rank passes a host x (or a bf16 y for an f32 model), every rank
// throws naming it, and the layer still runs a correct call afterwards.
TEST(MoeCudaInput, CollectiveLayersNameBadTensorsAndStayUsable) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const MoeConfig cfg = make_moe_config(8, 16, 4, 2);
  run_ranks(
      2,
      [&](Communicator& comm) {
        EpMoe ep(comm, cfg, 4, 2);
        TpMoe tp(comm, cfg, 4);
        Buffer x(DType::f32, {4, 8}, Device::cuda(0)), y(DType::f32, {4, 8}, Device::cuda(0));
        Buffer host_x(DType::f32, {4, 8}), bf16_y(DType::bf16, {4, 8}, Device::cuda(0));
        auto expect_error = [](const std::function<void()>& call, const std::string& words) {
          try {
            call();
            ADD_FAILURE() << "accepted: " << words;
          } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
          }
        };
        expect_error([&] { ep.forward(host_x, y); },
                     "EpMoe::forward: `x` must be on cuda:0, got cpu");
        expect_error([&] { tp.forward(x, bf16_y); }, "TpMoe::forward: `y` must be f32");
        ep.forward(x, y);
        tp.forward(x, y);
        synchronize(comm.stream());
      },
      Device::cuda(0));
}

// TP replicates tokens: ranks that pass different token counts all throw the CPU layer's error
// (tests/test_moe_errors.cpp) before anything is launched, so the layer then runs a correct call
// (a signal of the rejected call would have left the ranks' call numbers apart).
// TpMoe compares the ranks' token counts on the device (no host exchange): the call with 4 and 3
// tokens returns on both ranks and sums nothing; once the stream has passed it, the next call
// names both counts at entry, launching nothing; the call after that runs as usual.
TEST(MoeCudaInput, TpRanksWithDifferentTokenCountsAreToldOnTheDevice) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  cpu::set_blas_threads(1);
  const MoeConfig cfg = make_moe_config(16, 32, 4, 2);
  const int H = cfg.feature_dim, O = cfg.out_dim();
  std::vector<std::string> first(2), errors(2), after(2);
  std::vector<uint64_t> launched_by_second(2);
  run_ranks(
      2,
      [&](Communicator& comm) {
        const int r = comm.rank(), m = r == 0 ? 4 : 3;
        TpMoe tp(comm, cfg, 4);
        const Buffer input = reference::make_moe_input(cfg, 4, 1);
        Buffer x(cfg.dtype, {4, H}, Device::cuda(0)), y(cfg.dtype, {4, O}, Device::cuda(0));
        copy(x, input);
        try {
          tp.forward(Tensor(x.data<void>(), cfg.dtype, {m, H}, Device::cuda(0)),
                     Tensor(y.data<void>(), cfg.dtype, {m, O}, Device::cuda(0)));
          first[size_t(r)] = "(no error)";
        } catch (const Error& e) {
          first[size_t(r)] = e.what();
        }
        synchronize(comm.stream());
        const uint64_t launched = kernels_launched();
        try {
          tp.forward(x, y);
          errors[size_t(r)] = "(no error)";
        } catch (const Error& e) {
          errors[size_t(r)] = e.what();
        }
        launched_by_second[size_t(r)] = kernels_launched() - launched;
        tp.forward(x, y);
        synchronize(comm.stream());
        Buffer y_host(cfg.dtype, {4, O});
        copy(y_host, y);
        const auto cmp =
            reference::compare_moe(cfg, reference::reference_moe(cfg, input, {0, 1, 2, 3}), y_host,
                                   0, reference::moe_tolerance(cfg.dtype));
        after[size_t(r)] = cmp.compared == 0 ? "nothing compared" : cmp.error;
      },
      Device::cuda(0));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(first[size_t(r)], "(no error)") << "rank " << r;
    EXPECT_NE(errors[size_t(r)].find(r == 0 ? "rank 1 all-reduces 48 elements but rank 0 has 64"
                                            : "rank 0 all-reduces 64 elements but rank 1 has 48"),
              std::string::npos)
        << errors[size_t(r)];
    EXPECT_NE(errors[size_t(r)].find("every rank must pass the same number of tokens"),
              std::string::npos)
        << errors[size_t(r)];
    EXPECT_EQ(launched_by_second[size_t(r)], 0u) << "rank " << r;
    EXPECT_EQ(after[size_t(r)], "") << "rank " << r;
  }
}

// A TpMoe rank whose partial never lands: rank 1 enters forward, but captures it into a graph it
// never launches. Rank 0's wait gives up after
// PMOE_TIMEOUT_S and writes the fault word; its next forward names rank 1 and the wait, before it
// launches anything.
TEST(MoeCudaInput, TpRankWhosePartialNeverLandsIsNamed) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  cpu::set_blas_threads(1);
  // 2 s: long enough for the ranks' collective construction under the sanitizers, which this
  // timeout bounds too.
  setenv("PMOE_TIMEOUT_S", "2", 1);
  const MoeConfig cfg = make_moe_config(8, 16, 4, 2);
  std::string second;
  std::atomic<bool> first_call_done{false};
  uint64_t launched_by_second = 0;
  run_ranks(
      2,
      [&](Communicator& comm) {
        TpMoe tp(comm, cfg, 4);
        Buffer x(DType::f32, {4, 8}, Device::cuda(0)), y(DType::f32, {4, 8}, Device::cuda(0));
        if (comm.rank() == 1) {
          auto stream = static_cast<cudaStream_t>(comm.stream().handle);
          for (int call = 0; call < 2; ++call) {
            // The second waits until rank 0 has seen its first call time out, so that this
            // rank's host exchange does not time out meanwhile.
            while (call == 1 && !first_call_done.load()) std::this_thread::yield();
            cudaGraph_t graph = nullptr;
            EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                      cudaSuccess);
            tp.forward(x, y);
            EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
            if (graph) cudaGraphDestroy(graph);  // never launched: no partial, no signal
          }
          return;
        }
        tp.forward(x, y);            // its wait for rank 1's partial gives up on the device
        synchronize(comm.stream());  // bounded by the timeout
        first_call_done = true;
        const uint64_t launched = kernels_launched();
        try {
          tp.forward(x, y);
        } catch (const Error& e) {
          second = e.what();
        }
        launched_by_second = kernels_launched() - launched;
      },
      Device::cuda(0));
  unsetenv("PMOE_TIMEOUT_S");
  EXPECT_NE(second.find("TpMoe::forward on rank 0 (cuda:0): rank 1 did not deliver its partial "
                        "output within 2 s"),
            std::string::npos)
      << second;
  EXPECT_EQ(launched_by_second, 0u) << "a call after the timeout launched a kernel";
}

// A whole forward captured into a CUDA graph on each rank (EpMoe with both micro-batch counts:
// two streams, AllToAll, cuBLAS, the kernels; TpMoe: its signal words) and replayed with new
// inputs written into the captured x: every replay matches the reference.
TEST(MoeCudaGraph, ForwardCapturedAndReplayedWithNewInputs) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  cpu::set_blas_threads(1);
  for (MoeVariant v : {MoeVariant::ep, MoeVariant::tp})
    for (int mb : {1, 2}) {
      if (v == MoeVariant::tp && mb == 2) continue;
      const int W = 3, batch = 4 * W + 2;
      MoeConfig cfg = base_case(v, W, Activation::swiglu, DType::bf16).config;
      cfg.device_stats = true;  // what a captured forward must leave uncounted
      std::vector<std::string> errors(W);
      run_ranks(
          W,
          [&](Communicator& comm) {
            const RowRange mine =
                v == MoeVariant::ep ? shard_rows(batch, W, comm.rank()) : RowRange{0, batch};
            std::unique_ptr<EpMoe> ep;
            std::unique_ptr<TpMoe> tp;
            if (v == MoeVariant::ep)
              ep = std::make_unique<EpMoe>(comm, cfg, shard_rows(batch, W, 0).size(), mb);
            else
              tp = std::make_unique<TpMoe>(comm, cfg, batch);
            const int H = cfg.feature_dim, O = cfg.out_dim();
            Buffer x(cfg.dtype, {mine.size(), H}, Device::cuda(0));
            Buffer y(cfg.dtype, {mine.size(), O}, Device::cuda(0));
            Buffer y_host(cfg.dtype, {mine.size(), O});
            auto stream = static_cast<cudaStream_t>(comm.stream().handle);
            cudaGraph_t graph = nullptr;
            cudaGraphExec_t exec = nullptr;
            std::string& error = errors[size_t(comm.rank())];
            if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
              error = "begin capture failed";
            if (ep) ep->forward(x, y);
            if (tp) tp->forward(x, y);
            if (cudaStreamEndCapture(stream, &graph) != cudaSuccess ||
                cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
              error = "end capture or instantiate failed";
            if (ep && ep->last_stats().bytes_moved != 0)  // a captured forward counts nothing
              error = "bytes_moved of a captured forward";
            for (int replay = 0; replay < 3 && error.empty(); ++replay) {
              const Buffer input = reference::make_moe_input(cfg, batch, 100 + uint64_t(replay));
              const size_t row = size_t(H) * dtype_size(cfg.dtype);
              copy(x, Tensor(input.data<std::byte>() + size_t(mine.begin) * row, cfg.dtype,
                             {mine.size(), H}));
              if (cudaGraphLaunch(exec, stream) != cudaSuccess) error = "launch failed";
              synchronize(comm.stream());
              copy(y_host, y);
              std::vector<int> rows;
              for (int t = mine.begin; t < mine.end; ++t) rows.push_back(t);
              const auto cmp =
                  reference::compare_moe(cfg, reference::reference_moe(cfg, input, rows), y_host,
                                         mine.begin, reference::moe_tolerance(cfg.dtype));
              if (!cmp.error.empty()) error = detail::cat("replay ", replay, ": ", cmp.error);
              if (cmp.compared == 0 && mine.size() > 0) error = "nothing compared";
            }
            if (exec) cudaGraphExecDestroy(exec);
            if (graph) cudaGraphDestroy(graph);
          },
          Device::cuda(0));
      for (int r = 0; r < W; ++r)
        EXPECT_EQ(errors[size_t(r)], "")
            << variant_name(v) << " micro_batches " << mb << " rank " << r;
    }
}

// The expert GEMMs' padding under skewed routing (src/cuda/gemm/expert_tiles.hpp), at pmoe-bench's
// DeepSeek-V3 (32 experts, top-8) and Mixtral (8, top-2) presets: tokens pick k distinct experts
// with Zipf 1.2 weights (expert 0 the hottest), on W ranks with 128, 512 or 2048 tokens each.
// W = 1 is SimpleMoe (and each TpMoe rank: the same rows); W > 1 is EpMoe (one micro-batch).
// Wherever a rank has 1024 rows in use or more, the live tiles cover at most 1.15 x those rows.
// The batch the host launches for cuBLAS (f32 layers) is sized from a bound: for the local layers
// the rows in use, so Mixtral's stays within 1.15 too, while DeepSeek-V3's 32 experts at the
// 8-row tile floor add up to 256 rows (1.25 x at 128 tokens); for EpMoe the most a rank can
// receive, R min(k, E_local), far above what it gets. bf16 layers issue the live tiles only, as
// the grouped GEMM counts them on the device (test_cuda_grouped_gemm.cu).
TEST(MoeCudaTiles, PaddingUnderZipfRoutingAtThePresets) {
  struct Preset {
    const char* name;
    int experts, top_k;
    std::vector<int> worlds;
  };
  const Preset presets[] = {{"deepseek-v3", 32, 8, {1, 2, 4, 8, 16, 32}},
                            {"mixtral-8x7b", 8, 2, {1, 2, 4, 8}}};
  std::mt19937 rng(12);
  int checked = 0;
  for (const Preset& p : presets) {
    for (int W : p.worlds)
      for (int m : {128, 512, 2048}) {
        const int L = p.experts / W;
        const std::vector<int32_t> counts =
            zipf_expert_counts(p.experts, p.top_k, W * m, 1.2, rng);
        for (int r = 0; r < W; ++r) {
          const int32_t* mine = counts.data() + r * L;
          int64_t used = 0;
          for (int e = 0; e < L; ++e) used += mine[e];
          const int64_t R = int64_t(W) * m;
          const detail::ExpertTiles plan =
              W == 1 ? detail::plan_expert_tiles(L, m, int64_t(m) * p.top_k, int64_t(m) * p.top_k)
                     : detail::plan_expert_tiles(L, R, R * std::min(p.top_k, L),
                                                 R * p.top_k / W);
          const int64_t live = detail::live_tile_rows(mine, L, plan.tile);
          const std::string where = detail::cat(p.name, " W ", W, " m ", m, " rank ", r, ": ",
                                                used, " rows in use, tile ", plan.tile);
          EXPECT_GE(live, used) << where;
          EXPECT_GE(plan.rows(), live) << where;
          if (used < 1024) continue;
          ++checked;
          EXPECT_LE(double(live), 1.15 * double(used)) << where << ", live tiles " << live;
          if (W == 1 && p.experts == 8) {
            EXPECT_LE(double(plan.rows()), 1.15 * double(used)) << where << ", issued " << plan.rows();
          }
          if (W == 1) {
            EXPECT_LE(plan.rows(), used + L * plan.tile) << where;
          }
        }
      }
  }
  EXPECT_GT(checked, 50);
}

// What the device counts with MoeConfig::device_stats: the rows in use equal the CPU's (which
// computes exactly those), the live tiles' rows lie between them and the rows issued, and for
// SimpleMoe equal the host's rule over the CPU router's counts; a bf16 layer's grouped GEMM
// issues exactly the live tiles' rows. Without device_stats, nothing.
TEST(MoeCudaTiles, DeviceCountsRowsInUseAndLiveTilesOnlyWhenAsked) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  cpu::set_blas_threads(1);
  for (MoeVariant v : {MoeVariant::simple, MoeVariant::tp, MoeVariant::ep})
    for (bool asked : {false, true}) {
      const int W = v == MoeVariant::simple ? 1 : 2;
      MoeCase c;
      c.config = make_moe_config(16, 16, 8, 2, Activation::relu, DType::bf16);
      c.config.device_stats = asked;
      c.variant = v;
      c.batch = 96;
      c.micro_batches = v == MoeVariant::ep ? 2 : 1;
      const auto device = expect_case(c, W, Device::cuda(0));
      const auto cpu = expect_case(c, W, Device::cpu());
      for (int r = 0; r < W; ++r) {
        const MoeStats& d = device[size_t(r)].stats;
        const std::string where = detail::cat(describe(c, W), " rank ", r);
        if (!asked) {
          EXPECT_EQ(d.expert_rows_used, 0) << where;
          EXPECT_EQ(d.expert_rows_live, 0) << where;
          if (v == MoeVariant::ep) {
            EXPECT_EQ(d.bytes_moved, 0) << where;  // counted on the device (TpMoe's: the host's)
          }
          EXPECT_EQ(d.experts_s, 0.0) << where;
          continue;
        }
        EXPECT_EQ(d.expert_rows_used, cpu[size_t(r)].stats.expert_rows) << where;
        EXPECT_GT(d.expert_rows_used, 0) << where;
        EXPECT_GE(d.expert_rows_live, d.expert_rows_used) << where;
        EXPECT_GE(d.expert_rows, d.expert_rows_live) << where;
        EXPECT_GT(d.experts_s, 0.0) << where;
      }
      if (v != MoeVariant::simple || !asked) continue;
      // The host's rule over the CPU router's counts.
      const Buffer x = reference::make_moe_input(c.config, c.batch, c.input_seed);
      Router router(c.config);
      Buffer indices(DType::i32, {c.batch, 2}), weights(DType::f32, {c.batch, 2});
      router.route(x, indices, weights);
      std::vector<int32_t> counts(8, 0);
      for (int i = 0; i < c.batch * 2; ++i) ++counts[size_t(indices.data<int32_t>()[i])];
      const auto plan = detail::plan_expert_tiles(8, c.batch, 2 * c.batch, 2 * c.batch);
      EXPECT_EQ(device[0].stats.expert_rows_live, detail::live_tile_rows(counts.data(), 8, plan.tile));
      // bf16: the grouped GEMM computes the live tiles, no more (the batch bound is plan.rows()).
      EXPECT_EQ(device[0].stats.expert_rows, device[0].stats.expert_rows_live);
      EXPECT_LT(device[0].stats.expert_rows, plan.rows());
    }
}

// One forward of each layer, after a first one, counted by the emulated device: no host
// synchronisation, with or without device_stats; its kernels and stream work items, and what
// stats add; last_stats() waits only where stats were asked for.
TEST(MoeCudaStats, LaunchesAndHostSyncsOfOneForward) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  if (!kOnEmulatedDevice) GTEST_SKIP() << "the counts are the emulated device's";
  cpu::set_blas_threads(1);
  struct Count {
    uint64_t kernels, work, syncs, stats_syncs;
  };
  struct Layer {
    MoeVariant v;
    int micro_batches;
    Count without, with;  // expected
  };
  // One forward (bf16, H = O). Kernels: SimpleMoe widen (for the router), top-k, group, gather,
  // plan, the two grouped expert GEMMs, activate, weighted sum = 9; TpMoe those and count call,
  // done wait, publish count, landed, landed wait, sum, done = 16 at W = 2; EpMoe widen, top-k,
  // and a micro-batch's plan, two GEMMs, activate, narrow and AllToAll's (dispatch and combine:
  // 2 each with both phases, 3 each split) = 11 and 24. Work adds the router's cuBLAS GEMM and
  // with two micro-batches 8 event records and waits. Stats add 2 event records a timed phase (SimpleMoe 3, TpMoe 4,
  // EpMoe 4 and 11), the tally's or the end's event, and EpMoe's traffic-count kernel; last_stats()
  // then waits for each phase's end and that event.
  const Layer layers[] = {
      {MoeVariant::simple, 1, {9, 10, 0, 0}, {9, 17, 0, 4}},
      {MoeVariant::tp, 1, {16, 17, 0, 0}, {16, 26, 0, 5}},
      {MoeVariant::ep, 1, {11, 12, 0, 0}, {12, 22, 0, 5}},
      {MoeVariant::ep, 2, {24, 33, 0, 0}, {25, 57, 0, 12}},
  };
  std::string report;
  for (const Layer& l : layers)
    for (bool asked : {false, true}) {
      const int W = l.v == MoeVariant::simple ? 1 : 2;
      MoeConfig cfg = make_moe_config(16, 16, 4, 2, Activation::relu, DType::bf16);
      cfg.device_stats = asked;
      std::vector<Count> counted(static_cast<size_t>(W));
      run_ranks(
          W,
          [&](Communicator& comm) {
            const int m = 8;
            Buffer x(cfg.dtype, {m, 16}, Device::cuda(0)), y(cfg.dtype, {m, 16}, Device::cuda(0));
            copy(x, reference::make_moe_input(cfg, m, 3));
            std::unique_ptr<SimpleMoe> simple;
            std::unique_ptr<TpMoe> tp;
            std::unique_ptr<EpMoe> ep;
            if (l.v == MoeVariant::simple)
              simple = std::make_unique<SimpleMoe>(cfg, m, Device::cuda(0), comm.stream());
            if (l.v == MoeVariant::tp) tp = std::make_unique<TpMoe>(comm, cfg, m);
            if (l.v == MoeVariant::ep) ep = std::make_unique<EpMoe>(comm, cfg, m, l.micro_batches);
            auto forward = [&] {
              if (simple) simple->forward(x, y);
              if (tp) tp->forward(x, y);
              if (ep) ep->forward(x, y);
            };
            forward();
            synchronize(comm.stream());
            const uint64_t kernels = kernels_launched(), work = stream_work(), syncs = host_syncs();
            forward();
            Count& c = counted[size_t(comm.rank())];
            c.kernels = kernels_launched() - kernels;
            c.work = stream_work() - work;
            c.syncs = host_syncs() - syncs;
            const uint64_t before_stats = host_syncs();
            if (simple) (void)simple->last_stats();
            if (tp) (void)tp->last_stats();
            if (ep) (void)ep->last_stats();
            c.stats_syncs = host_syncs() - before_stats;
            synchronize(comm.stream());
            if (comm.side_stream().handle) synchronize(comm.side_stream());
          },
          Device::cuda(0));
      const Count& want = asked ? l.with : l.without;
      for (int r = 0; r < W; ++r) {
        const Count& c = counted[size_t(r)];
        const std::string where = detail::cat(variant_name(l.v), " micro_batches ",
                                              l.micro_batches, " stats ", asked, " rank ", r);
        report += detail::cat(where, ": kernels ", c.kernels, ", work ", c.work, ", syncs ",
                              c.syncs, ", last_stats syncs ", c.stats_syncs, "\n");
        EXPECT_EQ(c.kernels, want.kernels) << where;
        EXPECT_EQ(c.syncs, 0u) << where;
        EXPECT_EQ(c.work, want.work) << where;
        EXPECT_EQ(c.stats_syncs, want.stats_syncs) << where;
      }
    }
  std::cout << report;
}

// An f32 layer with MoeConfig::tf32 multiplies its experts' inputs as TF32: its output differs
// from the f32 layer's, and matches the reference within TF32's rounding (2^-11 relative per
// input, two GEMMs deep: 2^-8 of the magnitude of a sum's terms leaves room), where the f32
// layer holds the f32 tolerance (1e-5). A bf16 layer cannot ask for it.
TEST(MoeCudaGemm, Tf32IsAnF32LayersOptionAndRoundsTheInputs) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  cpu::set_blas_threads(1);
  MoeConfig cfg = make_moe_config(24, 36, 4, 2, Activation::gelu, DType::f32);
  const int m = 16, H = cfg.feature_dim, O = cfg.out_dim();
  const Buffer x = reference::make_moe_input(cfg, m, 5);
  const auto expected = reference::reference_moe(cfg, x, reference::all_rows(m));
  auto run = [&](const MoeConfig& c) {
    SimpleMoe layer(c, m, Device::cuda(0));
    Buffer x_device(DType::f32, {m, H}, Device::cuda(0)), y_device(DType::f32, {m, O}, Device::cuda(0));
    Buffer y(DType::f32, {m, O});
    copy(x_device, x);
    layer.forward(x_device, y_device);
    synchronize(Stream());
    copy(y, y_device);
    return y;
  };
  const Buffer f32 = run(cfg);
  cfg.tf32 = true;
  const Buffer tf32 = run(cfg);
  EXPECT_EQ(reference::compare_moe(cfg, expected, f32, 0, reference::moe_tolerance(DType::f32)).error,
            "");
  const auto cmp = reference::compare_moe(cfg, expected, tf32, 0, 0x1p-8);
  EXPECT_EQ(cmp.error, "");
  EXPECT_GT(cmp.compared, 0);
  int differs = 0;
  for (int i = 0; i < m * O; ++i) differs += f32.data<float>()[i] != tf32.data<float>()[i];
  EXPECT_GT(differs, 0) << "tf32 gave the f32 layer's bits: its inputs were not rounded";
  MoeConfig bad = cfg;
  bad.dtype = DType::bf16;
  try {
    bad.validate();
    ADD_FAILURE() << "a bf16 layer with tf32 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MoeConfig: tf32 applies to f32 layers"),
              std::string::npos)
        << e.what();
  }
}

// A bf16 layer keeps its experts' weights in bf16 on the device (half the f32 bytes), the router
// in f32: H E 4 + (E H 2F + E F O) 2 bytes for swiglu.
TEST(MoeCudaGemm, Bf16WeightsAreStoredInBf16) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const MoeConfig cfg = make_moe_config(24, 36, 4, 2, Activation::swiglu, DType::bf16, 16);
  SimpleMoe layer(cfg, 8, Device::cuda(0));
  const size_t H = 24, F = 36, E = 4, O = 16;
  EXPECT_EQ(layer.weight_bytes(), H * E * 4 + (E * H * 2 * F + E * F * O) * 2);
}

}  // namespace
}  // namespace pmoe::testing
