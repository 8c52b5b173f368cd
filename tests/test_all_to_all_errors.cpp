// Bad input to AllToAll: one test per rejected case, asserting the message. Every rank gets the
// same bad input, so every rank rejects it before sending; then a correct call must still work.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "all_to_all_cases.hpp"
#include "pmoe/error.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {
namespace {

// A complete, valid argument set for one rank.
struct Args {
  Args(const AllToAllConfig& cfg, int W, int rank)
      : in(reference::make_inputs(cfg, rank, cfg.max_tokens, 5, reference::Routing::random)),
        expert_num_tokens(DType::i32, {cfg.num_experts / W}),
        expert_x(cfg.in_dtype, {cfg.num_experts / W, int64_t(W) * cfg.max_tokens, cfg.hidden_dim}),
        expert_y(DType::bf16, {cfg.num_experts / W, int64_t(W) * cfg.max_tokens, cfg.hidden_dim}),
        y(cfg.out_dtype, {cfg.max_tokens, cfg.hidden_dim}) {
    if (cfg.in_dtype == DType::f8e4m3)
      expert_x_scale = Buffer(DType::f32, {cfg.num_experts / W, int64_t(W) * cfg.max_tokens,
                                           cfg.scales_per_token()});
    x = in.x;
    x_scale = in.x_scale_or_empty();
    indices = in.indices;
    weights = in.weights;
    scale_out = expert_x_scale.nbytes() ? expert_x_scale.tensor() : Tensor();
  }
  void dispatch(AllToAll& a, Phase phase = Phase::both) {
    a.dispatch(x, x_scale, indices, expert_num_tokens, expert_x, scale_out, phase);
  }
  void combine(AllToAll& a, Phase phase = Phase::both) {
    a.combine(expert_y, indices, weights, y, phase);
  }

  reference::AllToAllInputs in;
  Buffer expert_num_tokens, expert_x, expert_x_scale, expert_y, y;
  Tensor x, x_scale, indices, weights, scale_out;  // the views a test may replace
};

AllToAllConfig small_config(DType in = DType::bf16, int scale_block = 0) {
  return make_config(/*max_tokens=*/4, /*experts=*/4, /*top_k=*/2, /*hidden=*/32, in, DType::bf16,
                     scale_block);
}

// On W ranks: builds the op, applies `bad` (which must throw pmoe::Error containing `needle` on
// every rank), then checks a correct dispatch + combine still matches the reference.
void expect_rejected(const AllToAllConfig& cfg, const std::string& needle,
                     const std::function<void(AllToAll&, Args&)>& bad, int W = 2) {
  std::vector<std::string> errors(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) {
    AllToAll a2a(comm, cfg);
    Args args(cfg, W, comm.rank());
    try {
      bad(a2a, args);
      errors[size_t(comm.rank())] = "(no error)";
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
    // Nothing was lost: a correct call right after works and matches the reference.
    Args good(cfg, W, comm.rank());
    std::memset(good.expert_x.data<void>(), 0xA5, good.expert_x.nbytes());
    if (good.expert_x_scale.nbytes())
      std::memset(good.expert_x_scale.data<void>(), 0xA5, good.expert_x_scale.nbytes());
    good.dispatch(a2a);
    std::vector<reference::AllToAllInputs> all;
    for (int r = 0; r < W; ++r)
      all.push_back(reference::make_inputs(cfg, r, cfg.max_tokens, 5, reference::Routing::random));
    const auto expected = reference::reference_dispatch(cfg, W, comm.rank(), all);
    EXPECT_EQ(reference::compare_dispatch(cfg, W, expected, good.expert_num_tokens, good.expert_x,
                                          good.scale_out, 0xA5),
              "")
        << "after the rejected call";
    good.combine(a2a);
  });
  for (int r = 0; r < W; ++r)
    EXPECT_NE(errors[size_t(r)].find(needle), std::string::npos)
        << "rank " << r << " said: " << errors[size_t(r)] << "\nexpected: " << needle;
}

// The config is rejected at construction, on every rank, with `needle` in the message.
void expect_config_rejected(const AllToAllConfig& cfg, const std::string& needle, int W = 2) {
  std::vector<std::string> errors(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) {
    try {
      AllToAll a2a(comm, cfg);
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  });
  for (int r = 0; r < W; ++r)
    EXPECT_NE(errors[size_t(r)].find(needle), std::string::npos)
        << "rank " << r << " said: " << errors[size_t(r)];
}

// --- config -------------------------------------------------------------------------------

TEST(AllToAllConfigErrors, ExpertsNotDivisibleByWorldSize) {
  AllToAllConfig cfg = small_config();
  cfg.num_experts = 5;
  expect_config_rejected(cfg, "num_experts (5) must be divisible by the world size (2)");
}

TEST(AllToAllConfigErrors, TopKLargerThanExperts) {
  AllToAllConfig cfg = small_config();
  cfg.top_k = 5;
  expect_config_rejected(cfg, "top_k must be in [1, num_experts = 4], got 5");
}

TEST(AllToAllConfigErrors, ZeroSizes) {
  AllToAllConfig cfg = small_config();
  cfg.hidden_dim = 0;
  expect_config_rejected(cfg, "hidden_dim must be >= 1, got 0");
  cfg = small_config();
  cfg.max_tokens = 0;
  expect_config_rejected(cfg, "max_tokens must be >= 1, got 0");
  cfg = small_config();
  cfg.num_experts = 0;
  expect_config_rejected(cfg, "num_experts must be >= 1, got 0");
}

TEST(AllToAllConfigErrors, UnsupportedDtypes) {
  AllToAllConfig cfg = small_config();
  cfg.in_dtype = DType::i32;
  expect_config_rejected(cfg, "in_dtype must be f32, bf16, f16 or f8e4m3, got i32");
  cfg = small_config();
  cfg.out_dtype = DType::f8e4m3;
  expect_config_rejected(cfg, "out_dtype must be f32, bf16 or f16, got f8e4m3");
}

TEST(AllToAllConfigErrors, HiddenNotMultipleOfScaleBlock) {
  expect_config_rejected(small_config(DType::f8e4m3, 12),
                         "hidden_dim (32) must be a multiple of scale_block (12)");
}

TEST(AllToAllConfigErrors, F8WithoutScaleBlock) {
  expect_config_rejected(small_config(DType::f8e4m3, 0), "f8e4m3 input needs scale_block >= 1");
}

TEST(AllToAllConfigErrors, ScaleBlockForNonF8) {
  expect_config_rejected(small_config(DType::bf16, 16), "scale_block is for f8e4m3 input only");
}

TEST(AllToAllConfigErrors, HierarchicalNeedsRanksPerNode) {
  AllToAllConfig cfg = small_config();
  cfg.cross_node = CrossNode::hierarchical;
  expect_config_rejected(cfg, "cross_node = hierarchical needs ranks_per_node");
}

// The relay protocol is the CUDA kernels'; the CPU backend says so instead of running direct.
TEST(AllToAllConfigErrors, HierarchicalOnTheCpuNamesTheBackend) {
  AllToAllConfig cfg = small_config();
  cfg.ranks_per_node = 1;
  cfg.cross_node = CrossNode::hierarchical;
  expect_config_rejected(cfg, "AllToAll on the CPU: cross_node = hierarchical is a mode of the "
                              "CUDA backend");
}

// Node-summed combine is an option of hierarchical mode, which only the CUDA backend has.
TEST(AllToAllConfigErrors, CombineSumsInNodeNeedsHierarchicalAndTheCudaBackend) {
  AllToAllConfig cfg = small_config();
  cfg.ranks_per_node = 1;
  cfg.combine_sums_in_node = true;
  expect_config_rejected(cfg, "combine_sums_in_node is an option of cross_node = hierarchical");
  cfg.cross_node = CrossNode::hierarchical;
  expect_config_rejected(cfg, "AllToAll on the CPU: combine_sums_in_node (with cross_node = "
                              "hierarchical) is a mode of the CUDA backend");
}

// --- dispatch arguments ---------------------------------------------------------------------

TEST(AllToAllErrors, WrongDtype) {
  Buffer x_f32(DType::f32, {4, 32});
  expect_rejected(small_config(), "AllToAll::dispatch: `x` must be bf16 (bfloat16), got f32 (float32)",
                  [&](AllToAll& a, Args& args) { args.x = x_f32; args.dispatch(a); });
}

TEST(AllToAllErrors, WrongShape) {
  Buffer x_wide(DType::bf16, {4, 33});
  expect_rejected(small_config(), "`x` must have shape [4, 32], got [4, 33]",
                  [&](AllToAll& a, Args& args) { args.x = x_wide; args.dispatch(a); });
}

TEST(AllToAllErrors, WrongIndicesShape) {
  Buffer narrow(DType::i32, {4, 1});
  expect_rejected(small_config(), "`indices` must have shape [4, 2], got [4, 1]",
                  [&](AllToAll& a, Args& args) { args.indices = narrow; args.dispatch(a); });
}

TEST(AllToAllErrors, WrongOutputShape) {
  Buffer small_out(DType::bf16, {2, 4, 32});
  expect_rejected(small_config(), "`expert_x` must have shape [2, 8, 32], got [2, 4, 32]",
                  [&](AllToAll& a, Args& args) {
                    a.dispatch(args.x, args.x_scale, args.indices, args.expert_num_tokens,
                               small_out, args.scale_out);
                  });
}

TEST(AllToAllErrors, WrongCountDtype) {
  Buffer counts(DType::f32, {2});
  expect_rejected(small_config(), "`expert_num_tokens` must be i32 (int32), got f32 (float32)",
                  [&](AllToAll& a, Args& args) {
                    a.dispatch(args.x, args.x_scale, args.indices, counts, args.expert_x,
                               args.scale_out);
                  });
}

TEST(AllToAllErrors, WrongDevice) {
  expect_rejected(small_config(), "`x` must be on cpu, got cuda:0", [&](AllToAll& a, Args& args) {
    args.x = Tensor(args.x.data(), DType::bf16, {4, 32}, Device::cuda(0));
    args.dispatch(a);
  });
}

TEST(AllToAllErrors, NonContiguous) {
  Buffer wide(DType::bf16, {4, 64});
  const int64_t shape[] = {4, 32}, strides[] = {64, 1};
  expect_rejected(small_config(), "`x` must be row-major contiguous", [&](AllToAll& a, Args& args) {
    args.x = Tensor(wide.data<void>(), DType::bf16, 2, shape, strides);
    args.dispatch(a);
  });
}

TEST(AllToAllErrors, TooManyTokens) {
  Buffer x(DType::bf16, {5, 32}), indices(DType::i32, {5, 2});
  expect_rejected(small_config(), "m = 5 tokens exceeds max_tokens = 4",
                  [&](AllToAll& a, Args& args) {
                    args.x = x;
                    args.indices = indices;
                    args.dispatch(a);
                  });
}

TEST(AllToAllErrors, IndexAboveRange) {
  expect_rejected(small_config(), "indices[2, 1] = 4 is outside [-1, 4)",
                  [&](AllToAll& a, Args& args) {
                    args.in.indices.data<int32_t>()[2 * 2 + 1] = 4;
                    args.dispatch(a);
                  });
}

// i64 indices are checked as i64: a value whose low 32 bits are a valid expert is still rejected.
TEST(AllToAllErrors, Int64IndexBeyondInt32) {
  expect_rejected(small_config(), "indices[1, 0] = 4294967297 is outside [-1, 4)",
                  [&](AllToAll& a, Args& args) {
                    Buffer wide(DType::i64, {4, 2});  // one per rank: the ranks are threads
                    for (int i = 0; i < 8; ++i)
                      wide.data<int64_t>()[i] = args.in.indices.data<int32_t>()[i];
                    wide.data<int64_t>()[2] = (int64_t(1) << 32) + 1;
                    args.indices = wide;
                    args.dispatch(a);
                  });
}

TEST(AllToAllErrors, FloatIndicesNameWhatToPass) {
  Buffer floats(DType::f32, {4, 2});
  expect_rejected(small_config(),
                  "AllToAll::dispatch: `indices` holds expert indices: it must be i32 or i64 "
                  "(int32 or int64; torch.topk's int64 works as it is), got f32 (float32)",
                  [&](AllToAll& a, Args& args) {
                    args.indices = floats;
                    args.dispatch(a);
                  });
}

TEST(AllToAllErrors, IndexBelowMinusOne) {
  expect_rejected(small_config(), "indices[0, 0] = -2 is outside [-1, 4)",
                  [&](AllToAll& a, Args& args) {
                    args.in.indices.data<int32_t>()[0] = -2;
                    args.dispatch(a);
                  });
}

TEST(AllToAllErrors, RepeatedExpertInRow) {
  expect_rejected(small_config(), "expert 3 appears twice in row 1 of indices (slots 0 and 1)",
                  [&](AllToAll& a, Args& args) {
                    int32_t* idx = args.in.indices.data<int32_t>();
                    idx[2] = idx[3] = 3;
                    args.dispatch(a);
                  });
}

TEST(AllToAllErrors, RepeatedExpertInInt64Row) {
  // k = 3 so that a masked slot lies between the two: -1 is never a repeat, 2 is.
  AllToAllConfig cfg = small_config();
  cfg.top_k = 3;
  expect_rejected(cfg, "expert 2 appears twice in row 2 of indices (slots 0 and 2)",
                  [&](AllToAll& a, Args& args) {
                    Buffer wide(DType::i64, {4, 3});  // one per rank: the ranks are threads
                    for (int i = 0; i < 12; ++i)
                      wide.data<int64_t>()[i] = args.in.indices.data<int32_t>()[i];
                    for (int t = 0; t < 4; ++t)  // rows 0, 1, 3 pass: a -1 in the middle
                      wide.data<int64_t>()[t * 3 + 1] = -1;
                    wide.data<int64_t>()[6] = wide.data<int64_t>()[8] = 2;
                    args.indices = wide;
                    args.dispatch(a);
                  });
}

TEST(AllToAllErrors, F8WithoutScales) {
  expect_rejected(small_config(DType::f8e4m3, 16), "`x_scale` is missing (expected f32 [4, 2])",
                  [&](AllToAll& a, Args& args) { args.x_scale = Tensor(); args.dispatch(a); });
}

TEST(AllToAllErrors, ScalesForNonF8) {
  Buffer scales(DType::f32, {4, 2});
  expect_rejected(small_config(), "`x_scale` must be an empty Tensor (scales are for f8e4m3",
                  [&](AllToAll& a, Args& args) { args.x_scale = scales; args.dispatch(a); });
}

// --- combine arguments ----------------------------------------------------------------------

TEST(AllToAllErrors, CombineWeightsShape) {
  Buffer weights(DType::f32, {4, 3});
  expect_rejected(small_config(), "AllToAll::combine: `weights` must have shape [4, 2], got [4, 3]",
                  [&](AllToAll& a, Args& args) {
                    args.dispatch(a);
                    try {
                      a.combine(args.expert_y, args.indices, weights, args.y);
                    } catch (const Error&) {
                      args.combine(a);  // complete the call so the next dispatch is in order
                      throw;
                    }
                  });
}

TEST(AllToAllErrors, CombineOutputDtype) {
  Buffer y(DType::f32, {4, 32});
  expect_rejected(small_config(), "`y` must be bf16 (bfloat16), got f32 (float32)", [&](AllToAll& a, Args& args) {
    args.dispatch(a);
    try {
      a.combine(args.expert_y, args.indices, args.weights, y);
    } catch (const Error&) {
      args.combine(a);
      throw;
    }
  });
}

TEST(AllToAllErrors, CombineExpertYDtype) {
  Buffer expert_y(DType::i32, {2, 8, 32});
  expect_rejected(small_config(), "`expert_y` must be f32, bf16 or f16 (float32, bfloat16 or float16), got i32 (int32)",
                  [&](AllToAll& a, Args& args) {
                    args.dispatch(a);
                    try {
                      a.combine(expert_y, args.indices, args.weights, args.y);
                    } catch (const Error&) {
                      args.combine(a);
                      throw;
                    }
                  });
}

TEST(AllToAllErrors, CombineInt64IndicesDifferOnlyAbove32Bits) {
  expect_rejected(small_config(), "indices[2, 1] = 4294967297 differs from the 1 given",
                  [&](AllToAll& a, Args& args) {
                    args.in.indices.data<int32_t>()[5] = 1;
                    args.in.indices.data<int32_t>()[4] = 0;
                    args.dispatch(a);
                    Buffer wide(DType::i64, {4, 2});
                    for (int i = 0; i < 8; ++i)
                      wide.data<int64_t>()[i] = args.in.indices.data<int32_t>()[i];
                    wide.data<int64_t>()[5] += int64_t(1) << 32;
                    try {
                      a.combine(args.expert_y, wide, args.weights, args.y);
                    } catch (const Error&) {
                      args.combine(a);
                      throw;
                    }
                  });
}

TEST(AllToAllErrors, CombineIndicesDifferFromDispatch) {
  expect_rejected(small_config(), "differs from the", [&](AllToAll& a, Args& args) {
    args.dispatch(a);
    Buffer other(DType::i32, {4, 2});  // one per rank: the ranks are threads (TSan found it shared)
    std::memcpy(other.data<void>(), args.indices.data(), other.nbytes());
    other.data<int32_t>()[5] = -1;
    try {
      a.combine(args.expert_y, other, args.weights, args.y);
    } catch (const Error&) {
      args.combine(a);
      throw;
    }
  });
}

TEST(AllToAllErrors, ExpertYDtypeDiffersBetweenRanks) {
  const AllToAllConfig cfg = small_config();
  std::vector<std::string> errors(2);
  run_ranks(2, [&](Communicator& comm) {
    AllToAll a2a(comm, cfg);
    Args args(cfg, 2, comm.rank());
    args.dispatch(a2a);
    Buffer expert_y(comm.rank() == 0 ? DType::bf16 : DType::f32, {2, 8, 32});
    try {
      a2a.combine(expert_y, args.indices, args.weights, args.y);
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("rank 1 sent expert_y as f32 but this rank's is bf16"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("rank 0 sent expert_y as bf16 but this rank's is f32"),
            std::string::npos)
      << errors[1];
}

TEST(AllToAllErrors, InPlaceBuffersNeedTheConfigFlag) {
  std::string error;
  run_ranks(1, [&](Communicator& comm) {
    AllToAll a2a(comm, make_config(4, 4, 2, 32));
    try {
      a2a.input_buffer();
    } catch (const Error& e) {
      error = e.what();
    }
  });
  EXPECT_NE(error.find("set AllToAllConfig::in_place_buffers"), std::string::npos) << error;
}

TEST(AllToAllErrors, BoundMAboveTheRowsGiven) {
  Buffer bound(DType::i32, {1});
  *bound.data<int32_t>() = 5;
  expect_rejected(small_config(), "bound_m = 5 is outside [0, 4] (the rows given)",
                  [&](AllToAll& a, Args& args) {
                    a.dispatch(args.x, args.x_scale, args.indices, args.expert_num_tokens,
                               args.expert_x, args.scale_out, Phase::both, bound);
                  });
}

// --- phase order ----------------------------------------------------------------------------

TEST(AllToAllErrors, CombineBeforeDispatch) {
  expect_rejected(small_config(), "phase out of order: expected dispatch(send), got combine(send)",
                  [&](AllToAll& a, Args& args) { args.combine(a); });
}

TEST(AllToAllErrors, RecvBeforeSend) {
  expect_rejected(small_config(), "phase out of order: expected dispatch(send), got dispatch(recv)",
                  [&](AllToAll& a, Args& args) { args.dispatch(a, Phase::recv); });
}

TEST(AllToAllErrors, DispatchTwice) {
  expect_rejected(small_config(), "phase out of order: expected combine(send), got dispatch(send)",
                  [&](AllToAll& a, Args& args) {
                    args.dispatch(a);
                    try {
                      args.dispatch(a);
                    } catch (const Error&) {
                      args.combine(a);
                      throw;
                    }
                  });
}

// --- peers that never arrive ----------------------------------------------------------------

// A rank whose call is rejected never reaches its peers; the peers that wait for it time out
// and say why, from the rank's slot on the rejection board. A later good call clears the slot.
TEST(AllToAllErrors, PeersThatTimeOutNameTheRejectedCall) {
  setenv("PMOE_TIMEOUT_S", "0.5", 1);
  std::vector<std::string> errors(3);
  run_ranks(3, [&](Communicator& comm) {
    const AllToAllConfig cfg = make_config(4, 6, 2, 32);
    AllToAll a2a(comm, cfg);
    Args args(cfg, 3, comm.rank());
    if (comm.rank() == 2) {
      Buffer x_f32(DType::f32, {4, 32});
      args.x = x_f32;
      try {
        args.dispatch(a2a);
      } catch (const Error&) {
      }
      return;  // leaves without a good call: its peers must time out
    }
    try {
      args.dispatch(a2a);
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  });
  // A rejection followed by a good call leaves nothing on the board: rank 1's bad dispatch is
  // followed by a good one, then it skips combine; rank 0's combine times out without naming it.
  std::string stale;
  run_ranks(2, [&](Communicator& comm) {
    const AllToAllConfig cfg = make_config(4, 4, 2, 32);
    AllToAll a2a(comm, cfg);
    Args args(cfg, 2, comm.rank());
    if (comm.rank() == 1) {
      Buffer x_f32(DType::f32, {4, 32});
      const Tensor good = args.x;
      args.x = x_f32;
      try {
        args.dispatch(a2a);
      } catch (const Error&) {
      }
      args.x = good;
    }
    args.dispatch(a2a);
    if (comm.rank() == 1) return;
    try {
      args.combine(a2a);
    } catch (const Error& e) {
      stale = e.what();
    }
  });
  unsetenv("PMOE_TIMEOUT_S");
  for (int r : {0, 1})
    EXPECT_NE(errors[size_t(r)].find("rank 2 did not arrive within 0.5 s (waited for its "),
              std::string::npos)
        << errors[size_t(r)];
  for (int r : {0, 1})
    EXPECT_NE(errors[size_t(r)].find("; rank 2 rejected its call (AllToAll::dispatch: `x` must be "
                                     "bf16 (bfloat16), got f32 (float32)), and a call one rank "
                                     "rejects never reaches its peers"),
              std::string::npos)
        << errors[size_t(r)];
  EXPECT_NE(stale.find("rank 1 did not arrive within 0.5 s"), std::string::npos) << stale;
  EXPECT_EQ(stale.find("rejected its call"), std::string::npos) << stale;
  EXPECT_NE(stale.find("if rank 1 threw, its own error says why"), std::string::npos) << stale;
}

TEST(AllToAllErrors, RankThatNeverArrivesIsNamedOnEveryOtherRank) {
  setenv("PMOE_TIMEOUT_S", "1", 1);
  std::vector<std::string> errors(3), after(3);
  const auto start = std::chrono::steady_clock::now();
  run_ranks(3, [&](Communicator& comm) {
    const AllToAllConfig cfg = make_config(4, 6, 2, 32);
    AllToAll a2a(comm, cfg);
    if (comm.rank() == 2) return;  // builds the op, never calls dispatch
    Args args(cfg, 3, comm.rank());
    try {
      args.dispatch(a2a);
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
    try {
      args.dispatch(a2a);
    } catch (const Error& e) {
      after[size_t(comm.rank())] = e.what();
    }
  });
  unsetenv("PMOE_TIMEOUT_S");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (int r : {0, 1}) {
    EXPECT_NE(errors[size_t(r)].find("AllToAll::dispatch(recv) on rank " + std::to_string(r) +
                                     ": rank 2 did not arrive within 1 s"),
              std::string::npos)
        << errors[size_t(r)];
    EXPECT_NE(after[size_t(r)].find("this AllToAll is unusable"), std::string::npos)
        << after[size_t(r)];
  }
}

}  // namespace
}  // namespace pmoe::testing
