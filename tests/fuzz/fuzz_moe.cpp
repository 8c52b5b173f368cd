// Fuzz target: the MoE layers. A random MoeConfig (often invalid: zero or negative widths, top-k
// outside 1..E, an unsupported dtype, ffn or experts that the ranks cannot split), a variant
// (Simple, TP, EP with 1 or 2 micro-batches, or an invalid count) on 1..4 thread ranks, one config
// shared by every rank. The oracle: an invalid config or split throws pmoe::Error on every rank; a
// valid one matches the plain reference on every rank (run_moe_case checks it). Then, on a valid
// SimpleMoe, a forward with a bad argument (width, dtype, too many rows, output shape) must throw
// pmoe::Error. Never another exception, a crash, a sanitizer report or a timed-out wait.
#include <cstdint>
#include <memory>
#include <string>

#include "fuzz_check.hpp"
#include "fuzz_input.hpp"
#include "moe_cases.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::fuzz {
namespace {

using testing::MoeCase;
using testing::MoeVariant;

bool config_valid(const MoeConfig& c) {
  return c.hidden_dim >= 1 && c.ffn_dim >= 1 && c.output_dim >= 0 && c.num_experts >= 1 &&
         c.top_k >= 1 && c.top_k <= c.num_experts &&
         (c.dtype == DType::f32 || c.dtype == DType::bf16);
}

bool split_valid(const MoeCase& c, int W) {
  switch (c.variant) {
    case MoeVariant::simple: return true;
    case MoeVariant::tp: return c.config.ffn_dim % W == 0;
    case MoeVariant::ep:
      return c.config.num_experts % W == 0 && (c.micro_batches == 1 || c.micro_batches == 2);
  }
  return false;
}

// A SimpleMoe forward with one bad argument; it must throw.
void bad_forward(FuzzInput& in, const MoeConfig& config, int max_tokens) {
  SimpleMoe layer(config, max_tokens);
  const int H = config.hidden_dim, O = config.out_dim();
  int m = in.range(0, max_tokens);
  const DType wrong = config.dtype == DType::f32 ? DType::bf16 : DType::f32;
  Buffer x(config.dtype, {m, H}), y(config.dtype, {m, O});
  const int defect = in.range(0, 4);
  try {
    switch (defect) {
      case 0: layer.forward(Buffer(config.dtype, {m, H + 1}), y); break;
      case 1: layer.forward(Buffer(wrong, {m, H}), y); break;
      case 2: layer.forward(Buffer(config.dtype, {max_tokens + 1, H}),
                            Buffer(config.dtype, {max_tokens + 1, O})); break;
      case 3: layer.forward(x, Buffer(config.dtype, {m + 1, O})); break;
      case 4: layer.forward(x, Buffer(wrong, {m, O})); break;
    }
  } catch (const Error&) {
    return;
  }
  fuzz_bug("SimpleMoe::forward accepted bad argument number " + std::to_string(defect));
}

}  // namespace
}  // namespace pmoe::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  pmoe::fuzz::init_fuzzing();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pmoe;
  using namespace pmoe::fuzz;
  FuzzInput in(data, size);
  const int W = in.range(1, 4);
  MoeCase c;
  MoeConfig& g = c.config;
  g.hidden_dim = in.chance(12) ? in.range(-1, 0) : in.range(1, 24);
  g.ffn_dim = in.chance(12) ? in.range(-1, 0) : in.range(1, 24);
  g.output_dim = in.chance(12) ? -1 : in.range(0, 24);
  g.num_experts = in.chance(12) ? in.range(-1, 0) : in.range(1, 8);
  g.top_k = in.chance(12) ? in.range(-1, g.num_experts + 2) : in.range(1, std::max(1, g.num_experts));
  g.act = in.pick({Activation::relu, Activation::gelu, Activation::swiglu});
  g.dtype = in.chance(16) ? in.pick({DType::f16, DType::f8e4m3, DType::i32})
                          : in.pick({DType::f32, DType::bf16});
  g.seed = in.u64();
  c.variant = in.pick({MoeVariant::simple, MoeVariant::tp, MoeVariant::ep});
  c.micro_batches = in.chance(12) ? in.pick({0, 3}) : in.range(1, 2);
  c.batch = in.range(1, 12);
  c.calls = in.range(1, 3);
  c.input_seed = in.u64();
  const bool valid = config_valid(g) && split_valid(c, W);

  std::vector<std::string> errors(static_cast<size_t>(W));
  const auto outcomes = run_collective(W, [&](Communicator& comm) {
    errors[size_t(comm.rank())] = testing::run_moe_case(comm, c).error;
  });
  const bool threw = all_threw(outcomes, "MoE layer");
  if (!valid && !threw)
    fuzz_bug("an invalid MoE config or split was accepted: " + testing::describe(c, W));
  if (valid && threw)
    fuzz_bug("a valid MoE case threw: " + testing::describe(c, W) + ": " + outcomes[0].message);
  // The numbers are judged too: the reference bounds each output's error by the magnitude of
  // the terms that made it, so odd fuzzed shapes (F = 1, outputs that cancel) pass when correct.
  if (valid && !threw)
    for (int r = 0; r < W; ++r)
      if (!errors[size_t(r)].empty())
        fuzz_bug("a valid MoE case differs from the reference on rank " + std::to_string(r) +
                 ": " + testing::describe(c, W) + ": " + errors[size_t(r)]);
  if (valid) bad_forward(in, g, c.batch);
  count_outcome(threw);
  return 0;
}
