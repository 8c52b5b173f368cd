// Bad configs and bad forward() arguments for the MoE layers: one test per rejected case,
// asserting the message says what to change. A rejected forward leaves the layer usable.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "moe_cases.hpp"
#include "pmoe/error.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::testing {
namespace {

MoeConfig good_config() { return make_moe_config(16, 32, 4, 2); }

// Runs `fn` on W thread ranks; every rank must throw pmoe::Error containing `needle`.
void expect_error_on_ranks(int W, const std::string& needle,
                           const std::function<void(Communicator&)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) {
    try {
      fn(comm);
      errors[size_t(comm.rank())] = "(no error)";
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  });
  for (int r = 0; r < W; ++r)
    EXPECT_NE(errors[size_t(r)].find(needle), std::string::npos)
        << "rank " << r << " said: " << errors[size_t(r)];
}

void expect_config_error(const MoeConfig& c, const std::string& needle) {
  try {
    SimpleMoe layer(c, 4);
    ADD_FAILURE() << "no error; expected: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(MoeErrors, TopKAboveNumberOfExperts) {
  MoeConfig c = good_config();
  c.top_k = 5;
  expect_config_error(c, "top_k = 5 must be in 1..num_experts = 4; lower top_k or add experts");
}

TEST(MoeErrors, TopKZero) {
  MoeConfig c = good_config();
  c.top_k = 0;
  expect_config_error(c, "top_k = 0 must be in 1..num_experts = 4");
}

TEST(MoeErrors, ZeroFeatureDim) {
  MoeConfig c = good_config();
  c.hidden_dim = 0;
  expect_config_error(c, "hidden_dim must be >= 1 (the token width), got 0");
}

TEST(MoeErrors, ZeroFfnDim) {
  MoeConfig c = good_config();
  c.ffn_dim = 0;
  expect_config_error(c, "ffn_dim must be >= 1 (the expert hidden width), got 0");
}

TEST(MoeErrors, ZeroExperts) {
  MoeConfig c = good_config();
  c.num_experts = 0;
  c.top_k = 0;
  expect_config_error(c, "num_experts must be >= 1, got 0");
}

TEST(MoeErrors, NegativeOutputDim) {
  MoeConfig c = good_config();
  c.output_dim = -2;
  expect_config_error(c, "output_dim must be >= 0 (0 means hidden_dim), got -2");
}

TEST(MoeErrors, UnsupportedDtype) {
  MoeConfig c = good_config();
  c.dtype = DType::f16;
  expect_config_error(c, "dtype must be f32 or bf16, got f16");
}

TEST(MoeErrors, UnknownActivationValue) {
  MoeConfig c = good_config();
  c.act = static_cast<Activation>(7);
  expect_config_error(c, "act must be relu, gelu or swiglu, got value 7");
}

TEST(MoeErrors, UnknownActivationName) {
  try {
    parse_activation("tanh");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown activation 'tanh': expected relu, gelu or swiglu");
  }
}

TEST(MoeErrors, SimpleZeroMaxTokens) {
  try {
    SimpleMoe layer(good_config(), 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SimpleMoe: max_tokens must be >= 1"), std::string::npos)
        << e.what();
  }
}

TEST(MoeErrors, TpZeroMaxTokens) {
  expect_error_on_ranks(2, "TpMoe: max_tokens must be >= 1",
                        [](Communicator& comm) { TpMoe layer(comm, good_config(), 0); });
}

TEST(MoeErrors, EpZeroMaxTokens) {
  expect_error_on_ranks(2, "EpMoe: max_tokens must be >= 1",
                        [](Communicator& comm) { EpMoe layer(comm, good_config(), 0); });
}

TEST(MoeErrors, TpFfnNotDivisibleByRanks) {
  MoeConfig c = good_config();
  c.ffn_dim = 30;
  expect_error_on_ranks(4, "TpMoe: ffn_dim = 30 is not divisible by the 4 ranks",
                        [&](Communicator& comm) { TpMoe layer(comm, c, 4); });
  expect_error_on_ranks(4, "make ffn_dim a multiple of 4 (e.g. 32)",
                        [&](Communicator& comm) { TpMoe layer(comm, c, 4); });
}

TEST(MoeErrors, EpExpertsNotDivisibleByRanks) {
  MoeConfig c = good_config();
  c.num_experts = 6;
  expect_error_on_ranks(4,
                        "EpMoe: num_experts = 6 is not divisible by the 4 ranks; EP gives every "
                        "rank the same number of whole experts: use a multiple of 4 experts",
                        [&](Communicator& comm) { EpMoe layer(comm, c, 4); });
}

TEST(MoeErrors, EpMicroBatchesOutOfRange) {
  expect_error_on_ranks(2, "EpMoe: micro_batches must be 1 or 2, got 3",
                        [](Communicator& comm) { EpMoe layer(comm, good_config(), 4, 3); });
}

// Bad forward() arguments, on every variant: rejected with the message, then a good call works.
void expect_forward_rejected(
    const std::string& needle,
    const std::function<void(const std::function<void(const Tensor&, const Tensor&)>&,
                             const MoeConfig&)>& bad) {
  const MoeConfig c = good_config();
  const int W = 2, max_tokens = 4;
  for (MoeVariant v : {MoeVariant::simple, MoeVariant::tp, MoeVariant::ep}) {
    std::vector<std::string> errors(W), after(W);
    run_ranks(W, [&](Communicator& comm) {
      std::unique_ptr<SimpleMoe> simple;
      std::unique_ptr<TpMoe> tp;
      std::unique_ptr<EpMoe> ep;
      if (v == MoeVariant::simple) simple = std::make_unique<SimpleMoe>(c, max_tokens);
      if (v == MoeVariant::tp) tp = std::make_unique<TpMoe>(comm, c, max_tokens);
      if (v == MoeVariant::ep) ep = std::make_unique<EpMoe>(comm, c, max_tokens);
      auto forward = [&](const Tensor& x, const Tensor& y) {
        if (simple) simple->forward(x, y);
        if (tp) tp->forward(x, y);
        if (ep) ep->forward(x, y);
      };
      try {
        bad(forward, c);
        errors[size_t(comm.rank())] = "(no error)";
      } catch (const Error& e) {
        errors[size_t(comm.rank())] = e.what();
      }
      const Buffer x = reference::make_moe_input(c, max_tokens, 1);
      Buffer y(c.dtype, {max_tokens, c.out_dim()});
      forward(x, y);
      after[size_t(comm.rank())] =
          reference::compare_moe(c, reference::reference_moe(c, x, reference::all_rows(max_tokens)),
                                 y, 0, reference::moe_tolerance(c.dtype))
              .error;
    });
    for (int r = 0; r < W; ++r) {
      const std::string op = std::string(v == MoeVariant::simple ? "SimpleMoe"
                                         : v == MoeVariant::tp   ? "TpMoe"
                                                                 : "EpMoe") +
                             "::forward: ";
      EXPECT_NE(errors[size_t(r)].find(op + needle), std::string::npos)
          << "rank " << r << " said: " << errors[size_t(r)];
      EXPECT_EQ(after[size_t(r)], "") << "the call after the rejected one";
    }
  }
}

// EpMoe's bound is its max_tokens argument (the same keyword in Python): the message
// names that word, not SimpleMoe's and TpMoe's max_tokens.
TEST(MoeErrors, EpForwardMoreTokensNamesMaxTokensPerRank) {
  const MoeConfig c = good_config();
  expect_error_on_ranks(2, "build it with a larger max_tokens", [&](Communicator& comm) {
    EpMoe layer(comm, c, 4);
    Buffer x(c.dtype, {5, c.hidden_dim}), y(c.dtype, {5, c.out_dim()});
    layer.forward(x, y);
  });
}

TEST(MoeErrors, ForwardMoreTokensThanBuiltFor) {
  expect_forward_rejected(
      "x has 5 tokens, more than the 4 this layer was built for; build it with a larger max_tokens",
      [](auto& forward, const MoeConfig& c) {
        Buffer x(c.dtype, {5, c.hidden_dim}), y(c.dtype, {5, c.out_dim()});
        forward(x, y);
      });
}

TEST(MoeErrors, ForwardWrongInputDtype) {
  expect_forward_rejected("`x` must be f32 (float32), got bf16 (bfloat16)", [](auto& forward, const MoeConfig& c) {
    Buffer x(DType::bf16, {2, c.hidden_dim}), y(c.dtype, {2, c.out_dim()});
    forward(x, y);
  });
}

TEST(MoeErrors, ForwardWrongInputWidth) {
  expect_forward_rejected("`x` must have shape [m, 16] f32 (float32), got [2, 15]",
                          [](auto& forward, const MoeConfig& c) {
                            Buffer x(c.dtype, {2, 15}), y(c.dtype, {2, c.out_dim()});
                            forward(x, y);
                          });
}

TEST(MoeErrors, ForwardOutputRowsDiffer) {
  expect_forward_rejected("`y` must have shape [2, 16] f32 (float32), got [3, 16]",
                          [](auto& forward, const MoeConfig& c) {
                            Buffer x(c.dtype, {2, c.hidden_dim}), y(c.dtype, {3, c.out_dim()});
                            forward(x, y);
                          });
}

TEST(MoeErrors, ForwardWrongOutputDtype) {
  expect_forward_rejected("`y` must be f32 (float32), got bf16 (bfloat16)", [](auto& forward, const MoeConfig& c) {
    Buffer x(c.dtype, {2, c.hidden_dim}), y(DType::bf16, {2, c.out_dim()});
    forward(x, y);
  });
}

TEST(MoeErrors, ForwardStridedInput) {
  expect_forward_rejected(
      "`x` must be row-major contiguous", [](auto& forward, const MoeConfig& c) {
        Buffer storage(c.dtype, {4, 2 * c.hidden_dim}), y(c.dtype, {2, c.out_dim()});
        const int64_t shape[2] = {2, c.hidden_dim}, strides[2] = {2 * c.hidden_dim, 1};
        forward(Tensor(storage.data<void>(), c.dtype, 2, shape, strides), y);
      });
}

TEST(MoeErrors, ForwardMissingInput) {
  expect_forward_rejected("`x` is missing (expected [m, 16] f32 (float32))",
                          [](auto& forward, const MoeConfig& c) {
                            Buffer y(c.dtype, {2, c.out_dim()});
                            forward(Tensor(), y);
                          });
}

// TP replicates tokens: ranks that pass different token counts are told so.
TEST(MoeErrors, TpRanksWithDifferentTokenCounts) {
  std::string message;
  try {
    run_ranks(2, [](Communicator& comm) {
      const MoeConfig c = good_config();
      TpMoe layer(comm, c, 4);
      const int m = comm.rank() == 0 ? 4 : 3;
      const Buffer x = reference::make_moe_input(c, m, 1);
      Buffer y(c.dtype, {m, c.out_dim()});
      layer.forward(x, y);
    });
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("TpMoe::forward: rank "), std::string::npos) << message;
  EXPECT_NE(message.find("every rank must pass the same number of tokens"), std::string::npos)
      << message;
}

}  // namespace
}  // namespace pmoe::testing
