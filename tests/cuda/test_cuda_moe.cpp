// The MoE layers on one CUDA device shared by W thread ranks (W in {1, 2, 3, 4}), each rank with
// its own stream: SimpleMoe, TpMoe and EpMoe against the plain reference and against the CPU
// backend, every activation, f32 and bf16, uneven expert loads, ranks with no tokens, output
// width != feature width, many calls on one layer, more work than one pass of a kernel's grid.
// Bad input, the experts' GEMMs and a forward's launches: test_cuda_moe_input.cpp,
// _experts.cpp, _launches.cpp, built into the same program.
// Built for the emulated device and for a GPU (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

// After the standard headers: the emulated device's defines qualifiers such as __noinline__.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/cuda_moe_test_helpers.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "moe_cases.hpp"
#include "pmoe/comm.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::testing {
namespace {

constexpr Activation kActivations[] = {Activation::relu, Activation::gelu, Activation::swiglu};

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
  const int H = cfg.hidden_dim, k = cfg.top_k;
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

}  // namespace
}  // namespace pmoe::testing
