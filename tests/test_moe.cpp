// The MoE layers against the plain reference (src/reference/moe_reference.hpp): SimpleMoe, TpMoe
// and EpMoe at W in {1, 2, 4} thread ranks, every activation, f32 and bf16, several experts per
// rank, top-k = E, batches not divisible by W (and smaller than W), micro_batches 1 and 2, many
// calls on one layer; plus the router, the experts' TP slices and the weight generator.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <vector>

#include "cpu/gemm.hpp"
#include "moe_cases.hpp"
#include "pmoe/error.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::testing {
namespace {

constexpr Activation kActivations[] = {Activation::relu, Activation::gelu, Activation::swiglu};
constexpr int kWorldSizes[] = {1, 2, 4};

// Runs `c` on W thread ranks; every rank must match the reference. Returns rank r's output.
std::vector<std::vector<float>> expect_case(const MoeCase& c, int W) {
  std::vector<MoeCaseResult> results(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) { results[size_t(comm.rank())] = run_moe_case(comm, c); });
  std::vector<std::vector<float>> outputs;
  int compared = 0, skipped = 0;
  for (const MoeCaseResult& r : results) {
    EXPECT_EQ(r.error, "");
    compared += r.compared;
    skipped += r.skipped;
    outputs.push_back(r.y);
  }
  // The comparison is real: rows were compared, and ties skipped at most a few of them.
  EXPECT_GT(compared, 0) << describe(c, W);
  EXPECT_LE(skipped * 10, compared + skipped) << describe(c, W);
  return outputs;
}

MoeCase base_case(MoeVariant v, int W, Activation act, DType dtype) {
  MoeCase c;
  // Two experts per rank; ffn divisible by 4 for TP; a batch no W divides.
  c.config =
      make_moe_config(/*feature=*/24, /*ffn=*/32, /*experts=*/2 * W, /*top_k=*/2, act, dtype);
  c.variant = v;
  c.batch = 4 * W + 3;
  return c;
}

void expect_every_shape(MoeVariant v) {
  cpu::set_blas_threads(1);  // thread ranks call BLAS at once
  for (int W : kWorldSizes)
    for (Activation act : kActivations)
      for (DType dtype : {DType::f32, DType::bf16}) expect_case(base_case(v, W, act, dtype), W);
}

TEST(Moe, SimpleMatchesReference) { expect_every_shape(MoeVariant::simple); }
TEST(Moe, TpMatchesReference) { expect_every_shape(MoeVariant::tp); }
TEST(Moe, EpMatchesReference) { expect_every_shape(MoeVariant::ep); }

TEST(Moe, EpMicroBatchesMatchReference) {
  for (int W : kWorldSizes)
    for (Activation act : kActivations) {
      MoeCase c = base_case(MoeVariant::ep, W, act, DType::f32);
      c.micro_batches = 2;
      expect_case(c, W);
      c.config.dtype = DType::bf16;
      expect_case(c, W);
    }
}

// A placement with two replicas of every expert, on 2 and 4 ranks: the layer matches the
// reference (which knows no slots), whichever replica a token reaches.
TEST(Moe, EpWithReplicasMatchesReference) {
  cpu::set_blas_threads(1);
  for (int W : {2, 4})
    for (int mb : {1, 2}) {
      MoeCase c = base_case(MoeVariant::ep, W, Activation::swiglu, DType::bf16);
      c.micro_batches = mb;
      c.placement = ExpertPlacement::round_robin(c.config.num_experts, 2 * c.config.num_experts);
      c.calls = 3;
      expect_case(c, W);
    }
}

// 4 ranks, every expert on two of them (rank r + 2 holds rank r's): rank 3 stops after two
// forwards, the others mask it, and every later forward of theirs still matches the reference
// for their tokens: no token lost. The stopped rank keeps its layer until all are done.
TEST(Moe, EpGoesOnWithoutAMaskedRankWhoseExpertsHaveReplicas) {
  cpu::set_blas_threads(1);
  const int W = 4;
  const MoeConfig config = make_moe_config(16, 24, 4, 2, Activation::gelu, DType::f32);
  EpMoeOptions options;
  options.placement = ExpertPlacement::round_robin(4, 8);
  options.rank_mask = true;
  const int batch = 11;
  std::vector<std::string> errors(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) {
    const int rank = comm.rank();
    EpMoe ep(comm, config, shard_rows(batch, W, 0).size(), options);
    std::vector<uint8_t> live(W, 1);
    for (int call = 0; call < 5; ++call) {
      if (call == 2) {
        if (rank == 3) break;
        ep.mask_rank(3, "stopped");
        live[3] = 0;
        EXPECT_TRUE(ep.lost_experts().empty());
        EXPECT_EQ(ep.rank_mask().live, live);
      }
      const std::string error = forward_ep_shard(ep, comm, batch, 40 + uint64_t(call));
      if (!error.empty() && errors[size_t(rank)].empty())
        errors[size_t(rank)] = "call " + std::to_string(call) + ": " + error;
    }
    comm.barrier();  // with the stopped rank
  });
  for (int r = 0; r < W; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

// on_peer_loss = mask: a rank lost and taken back (moe_cases.hpp), on the CPU, with one and two
// micro-batches.
class MoePeerLoss : public ::testing::TestWithParam<int> {};

TEST_P(MoePeerLoss, EpGoesOnWhenARankIsLostAndTakesItBack) {
  cpu::set_blas_threads(1);
  expect_ep_moe_loses_a_rank_and_takes_it_back(Device::cpu(), GetParam(), 1.0);
}

INSTANTIATE_TEST_SUITE_P(MicroBatches, MoePeerLoss, ::testing::Values(1, 2));

TEST(Moe, EpPlacementErrors) {
  run_ranks(2, [](Communicator& comm) {
    const MoeConfig config = make_moe_config(8, 8, 4, 2);
    EpMoeOptions wrong_count;
    wrong_count.placement = ExpertPlacement::round_robin(3, 6);  // 3 logical, the layer has 4
    EXPECT_THROW(EpMoe(comm, config, 4, wrong_count), Error);
    EpMoeOptions odd_slots;
    odd_slots.placement = ExpertPlacement::round_robin(4, 5);  // 5 slots on 2 ranks
    EXPECT_THROW(EpMoe(comm, config, 4, odd_slots), Error);
    EpMoe plain(comm, config, 4);
    EXPECT_THROW(plain.mask_rank(1 - comm.rank(), ""), Error);  // not made maskable
  });
}

// The seed's shape (feature 32, hidden 128, output 64) and its mirror (output < feature): EP
// moves rows of width max(H, O) and must drop the padding.
TEST(Moe, OutputWidthDiffersFromFeatureWidth) {
  for (int out : {64, 16})
    for (MoeVariant v : {MoeVariant::simple, MoeVariant::tp, MoeVariant::ep})
      for (int mb : {1, 2}) {
        if (v != MoeVariant::ep && mb == 2) continue;
        MoeCase c;
        c.config = make_moe_config(32, 128, 4, 2, Activation::relu, DType::f32, out);
        c.variant = v;
        c.micro_batches = mb;
        c.batch = 19;
        expect_case(c, 4);
        c.config.dtype = DType::bf16;
        expect_case(c, 4);
      }
}

TEST(Moe, TopKEqualsNumberOfExperts) {
  for (int W : kWorldSizes)
    for (MoeVariant v : {MoeVariant::simple, MoeVariant::tp, MoeVariant::ep}) {
      MoeCase c = base_case(v, W, Activation::gelu, DType::f32);
      c.config.top_k = c.config.num_experts;
      expect_case(c, W);
    }
}

TEST(Moe, OneExpertPerRankAndManyExpertsPerRank) {
  for (int experts_per_rank : {1, 5})
    for (MoeVariant v : {MoeVariant::tp, MoeVariant::ep}) {
      MoeCase c = base_case(v, 4, Activation::swiglu, DType::f32);
      c.config.num_experts = 4 * experts_per_rank;
      c.config.top_k = std::min(3, c.config.num_experts);
      expect_case(c, 4);
    }
}

// Fewer tokens than ranks: some EP ranks have none, and a batch of 0 tokens runs too.
TEST(Moe, BatchSmallerThanRanks) {
  for (MoeVariant v : {MoeVariant::simple, MoeVariant::tp, MoeVariant::ep})
    for (int mb : {1, 2}) {
      if (v != MoeVariant::ep && mb == 2) continue;
      MoeCase c = base_case(v, 4, Activation::relu, DType::f32);
      c.micro_batches = mb;
      c.batch = 2;  // calls run 2, 1, 0, 2, ... tokens
      c.calls = 6;
      std::vector<MoeCaseResult> results(4);
      run_ranks(4,
                [&](Communicator& comm) { results[size_t(comm.rank())] = run_moe_case(comm, c); });
      int compared = 0;
      for (const auto& r : results) {
        EXPECT_EQ(r.error, "");
        compared += r.compared;
      }
      EXPECT_GT(compared, 0);
    }
}

// micro_batches = 2 computes the same layer as micro_batches = 1.
TEST(Moe, MicroBatchesOneAndTwoAgree) {
  for (int W : {2, 4})
    for (DType dtype : {DType::f32, DType::bf16}) {
      MoeCase c = base_case(MoeVariant::ep, W, Activation::swiglu, dtype);
      c.batch = 8 * W + 5;
      const auto one = expect_case(c, W);
      c.micro_batches = 2;
      const auto two = expect_case(c, W);
      ASSERT_EQ(one.size(), two.size());
      for (size_t r = 0; r < one.size(); ++r) {
        ASSERT_EQ(one[r].size(), two[r].size());
        double worst = 0, scale = 0;
        for (size_t i = 0; i < one[r].size(); ++i) {
          worst = std::max(worst, double(std::abs(one[r][i] - two[r][i])));
          scale = std::max(scale, double(std::abs(one[r][i])));
        }
        EXPECT_LE(worst, reference::moe_tolerance(dtype) * scale)
            << "rank " << r << " W=" << W << " " << dtype_name(dtype);
      }
    }
}

// One layer, many forwards with changing token counts: buffers and epochs are reused.
TEST(Moe, ManyCallsOnOneLayer) {
  for (MoeVariant v : {MoeVariant::simple, MoeVariant::tp, MoeVariant::ep})
    for (int mb : {1, 2}) {
      if (v != MoeVariant::ep && mb == 2) continue;
      MoeCase c = base_case(v, 4, Activation::relu, DType::f32);
      c.micro_batches = mb;
      c.calls = 30;
      expect_case(c, 4);
    }
}

TEST(Moe, SameBitsRunAfterRun) {
  for (MoeVariant v : {MoeVariant::simple, MoeVariant::tp, MoeVariant::ep}) {
    const MoeCase c = base_case(v, 4, Activation::gelu, DType::bf16);
    EXPECT_EQ(expect_case(c, 4), expect_case(c, 4)) << variant_name(v);
  }
}

// The router against plain loops over moe_weight(): descending logits, weights summing to 1.
TEST(Router, MatchesPlainLoops) {
  const MoeConfig c = make_moe_config(20, 8, 7, 3);
  Router router(c);
  const int m = 11;
  const Buffer x = reference::make_moe_input(c, m, 3);
  Buffer indices(DType::i32, {m, 3}), weights(DType::f32, {m, 3});
  router.route(x, indices, weights);
  for (int t = 0; t < m; ++t) {
    std::vector<double> logits(7, 0.0);
    for (int e = 0; e < 7; ++e)
      for (int h = 0; h < 20; ++h)
        logits[size_t(e)] +=
            double(x.data<float>()[t * 20 + h]) * moe_weight(c, MoeTensor::router, 0, h, e);
    double sum = 0, previous = INFINITY;
    for (int j = 0; j < 3; ++j) {
      const int e = indices.data<int32_t>()[t * 3 + j];
      ASSERT_GE(e, 0);
      ASSERT_LT(e, 7);
      EXPECT_LE(logits[size_t(e)], previous) << "token " << t << " slot " << j;
      previous = logits[size_t(e)];
      sum += weights.data<float>()[t * 3 + j];
    }
    // No unchosen expert has a larger logit than the last chosen one.
    for (int e = 0; e < 7; ++e) {
      bool chosen = false;
      for (int j = 0; j < 3; ++j) chosen = chosen || indices.data<int32_t>()[t * 3 + j] == e;
      if (!chosen) {
        EXPECT_LE(logits[size_t(e)], previous + 1e-6) << "token " << t;
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
    const double w0 = weights.data<float>()[t * 3], w1 = weights.data<float>()[t * 3 + 1];
    const int e0 = indices.data<int32_t>()[t * 3], e1 = indices.data<int32_t>()[t * 3 + 1];
    EXPECT_NEAR(w1 / w0, std::exp(logits[size_t(e1)] - logits[size_t(e0)]), 1e-5);
  }
}

// TP's premise: an expert's outputs over the W hidden slices add up to the whole expert's.
TEST(Experts, HiddenSlicesSumToTheWholeExpert) {
  for (Activation act : kActivations) {
    const MoeConfig c = make_moe_config(16, 12, 3, 1, act, DType::f32, 10);
    const int rows = 9;
    const Buffer x = reference::make_moe_input(c, rows, 5);
    Experts whole(c, 1, 2, 0, 12);
    Buffer y(DType::f32, {rows, 10});
    whole.forward(1, x, y);  // expert 2
    std::vector<double> sum(size_t(rows) * 10, 0.0);
    for (int begin = 0; begin < 12; begin += 4) {
      Experts slice(c, 2, 1, begin, begin + 4);
      Buffer part(DType::f32, {rows, 10});
      slice.forward(0, x, part);
      for (int i = 0; i < rows * 10; ++i) sum[size_t(i)] += part.data<float>()[i];
    }
    for (int i = 0; i < rows * 10; ++i)
      EXPECT_NEAR(y.data<float>()[i], sum[size_t(i)], 1e-5) << activation_name(act) << " " << i;
    const size_t halves = act == Activation::swiglu ? 2 : 1;
    EXPECT_EQ(whole.weight_bytes(), 2 * (16 * 12 * halves + 12 * 10) * sizeof(float));
  }
}

TEST(MoeWeights, PureFunctionOfItsCounters) {
  MoeConfig c = make_moe_config(64, 32, 4, 2);
  const float a = moe_weight(c, MoeTensor::w1, 3, 10, 7);
  EXPECT_EQ(a, moe_weight(c, MoeTensor::w1, 3, 10, 7));
  EXPECT_NE(a, moe_weight(c, MoeTensor::w1, 2, 10, 7));
  EXPECT_NE(a, moe_weight(c, MoeTensor::w1_linear, 3, 10, 7));
  EXPECT_NE(a, moe_weight(c, MoeTensor::w1, 3, 7, 10));
  c.seed = 43;
  EXPECT_NE(a, moe_weight(c, MoeTensor::w1, 3, 10, 7));
  // Uniform in [-sqrt(3 / fan_in), sqrt(3 / fan_in)): mean near 0, variance near 1 / fan_in.
  double sum = 0, squares = 0;
  const int n = 64 * 32;
  for (int h = 0; h < 64; ++h)
    for (int f = 0; f < 32; ++f) {
      const double v = moe_weight(c, MoeTensor::w1, 0, h, f);
      ASSERT_LT(std::abs(v), std::sqrt(3.0 / 64) + 1e-7);
      sum += v;
      squares += v * v;
    }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(squares / n * 64, 1.0, 0.1);
  // bf16 weights are bf16 values.
  c.dtype = DType::bf16;
  const float b = moe_weight(c, MoeTensor::w2, 1, 3, 4);
  EXPECT_EQ(b, to_float(to_bf16(b)));
}

TEST(MoeShards, RowsSplitEvenlyFirstRanksTakeTheRest) {
  EXPECT_EQ(shard_rows(11, 4, 0).begin, 0);
  EXPECT_EQ(shard_rows(11, 4, 0).size(), 3);
  EXPECT_EQ(shard_rows(11, 4, 2).begin, 6);
  EXPECT_EQ(shard_rows(11, 4, 2).size(), 3);
  EXPECT_EQ(shard_rows(11, 4, 3).begin, 9);
  EXPECT_EQ(shard_rows(11, 4, 3).size(), 2);
  EXPECT_EQ(shard_rows(2, 4, 3).size(), 0);
}

// One bf16 layer's output judged element by element: outputs whose terms nearly cancel (|y| far
// below the terms summed) may be off by a rounding of those terms, and are not failed for it; an
// error larger than that still fails. Before, errors were relative to max |y|, so a layer whose
// outputs all cancel failed for its roundings.
TEST(MoeReference, OutputsThatCancelAreJudgedByTheMagnitudeOfTheirTerms) {
  MoeConfig c;
  c.hidden_dim = 16, c.ffn_dim = 32, c.num_experts = 4, c.top_k = 2;
  c.act = Activation::swiglu, c.dtype = DType::bf16, c.seed = 5;
  const int tokens = 6, O = c.out_dim();
  const Buffer x = reference::make_moe_input(c, tokens, 3);
  const auto real = reference::reference_moe(c, x, reference::all_rows(tokens));
  double smallest_ratio = INFINITY;
  for (size_t i = 0; i < real.y.size(); ++i) {  // the magnitude bounds the output it made
    ASSERT_GE(real.magnitude[i], std::abs(real.y[i]) * (1 - 1e-12)) << i;
    smallest_ratio = std::min(smallest_ratio, real.magnitude[i] / std::abs(real.y[i]));
  }
  EXPECT_GE(smallest_ratio, 1.0);

  // The same terms, summing to almost nothing: y = +-1e-3 everywhere; got = y plus a third of
  // bf16's rounding (2^-9) of the terms (an error a correct layer may make), then plus 3x it.
  reference::MoeExpected cancel = real;
  for (size_t i = 0; i < cancel.y.size(); ++i) cancel.y[i] = i % 2 ? 1e-3 : -1e-3;
  for (double off : {0.35 * std::ldexp(1.0, -9), 3 * reference::moe_tolerance(c.dtype)}) {
    Buffer got(DType::bf16, {tokens, O});
    for (size_t i = 0; i < cancel.y.size(); ++i)
      got.data<bf16>()[i] = to_bf16(float(cancel.y[i] + off * cancel.magnitude[i]));
    const auto cmp = reference::compare_moe(c, cancel, got, 0, reference::moe_tolerance(c.dtype));
    EXPECT_EQ(cmp.compared, tokens - cmp.skipped);
    if (off < reference::moe_tolerance(c.dtype))
      EXPECT_EQ(cmp.error, "") << "a rounding of the terms failed a correct output";
    else
      EXPECT_NE(cmp.error.find("relative to the magnitude of its terms"), std::string::npos)
          << "an error of 3x the tolerance passed: " << cmp.max_error;
  }
}

}  // namespace
}  // namespace pmoe::testing
