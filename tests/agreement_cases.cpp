#include "agreement_cases.hpp"

#include "moe_cases.hpp"
#include "overlap_cases.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"
#include "pmoe/overlap.hpp"

namespace pmoe::testing {
namespace {

AllToAllConfig base_all_to_all(int W) {
  AllToAllConfig c;
  c.max_tokens = 8;
  c.num_experts = 2 * W;
  c.top_k = 2;
  c.hidden_dim = 32;
  c.in_dtype = DType::bf16;
  c.out_dtype = DType::bf16;
  return c;
}

// A case where the odd rank changes one field with `change` and the others keep `base`.
template <typename Config, typename Build>
AgreementCase mismatch(std::string object, std::string field, Config base,
                       std::function<void(Config&)> change, std::string values, Build build) {
  AgreementCase c;
  c.name = object + "." + field;
  c.build = [=](Communicator& comm, bool odd) {
    Config config = base;
    if (odd) change(config);
    build(comm, config);
  };
  c.expected = "the ranks' configs differ in " + field + " (" + values + ")";
  return c;
}

}  // namespace

std::vector<AgreementCase> agreement_cases(int W) {
  std::vector<AgreementCase> cases;
  const std::string odd = std::to_string(W - 1);
  const std::string others = W == 2 ? "rank 0" : "ranks 0, 1" + std::string(W > 3 ? ", 2" : "");
  auto on = [&](const std::string& mine, const std::string& theirs) {
    return mine + " on " + others + "; " + theirs + " on rank " + odd;
  };

  // AllToAll: every field.
  auto a2a = [](Communicator& comm, const AllToAllConfig& c) { AllToAll op(comm, c); };
  using A = AllToAllConfig;
  const A a = base_all_to_all(W);
  auto add_a2a = [&](std::string field, std::function<void(A&)> change, std::string values) {
    cases.push_back(mismatch<A>("AllToAll", field, a, change, values, a2a));
  };
  add_a2a("max_tokens", [](A& c) { c.max_tokens = 9; }, on("8", "9"));
  add_a2a("num_experts", [W](A& c) { c.num_experts = 4 * W; },
          on(std::to_string(2 * W), std::to_string(4 * W)));
  add_a2a("top_k", [](A& c) { c.top_k = 1; }, "1 on rank " + odd + "; 2 on " + others);
  add_a2a("hidden_dim", [](A& c) { c.hidden_dim = 64; }, on("32", "64"));
  add_a2a("in_dtype", [](A& c) { c.in_dtype = DType::f16; }, "f16 on rank " + odd + "; bf16 on " + others);
  add_a2a("out_dtype", [](A& c) { c.out_dtype = DType::f32; }, "f32 on rank " + odd + "; bf16 on " + others);
  add_a2a("in_place_buffers", [](A& c) { c.in_place_buffers = true; }, on("false", "true"));
  add_a2a("ranks_per_node", [](A& c) { c.ranks_per_node = 1; }, on("0", "1"));
  {
    A split = a;
    split.ranks_per_node = 1;
    cases.push_back(mismatch<A>("AllToAll", "cross_node", split,
                                [](A& c) { c.cross_node = CrossNode::hierarchical; },
                                on("direct", "hierarchical"), a2a));
  }
  {
    A f8 = a;
    f8.in_dtype = DType::f8e4m3;
    f8.scale_block = 16;
    cases.push_back(mismatch<A>("AllToAll", "scale_block", f8,
                                [](A& c) { c.scale_block = 32; }, on("16", "32"), a2a));
  }
  {  // The odd rank's own validation fails: it says why, and its peers say who and why.
    AgreementCase c;
    c.name = "AllToAll.rejected_on_one_rank";
    c.build = [a](Communicator& comm, bool is_odd) {
      A config = a;
      if (is_odd) config.hidden_dim = 0;
      AllToAll op(comm, config);
    };
    c.expected = "rank " + odd + " rejected its config (AllToAllConfig: hidden_dim must be >= 1, got 0)";
    c.expected_on_odd_rank = "AllToAllConfig: hidden_dim must be >= 1, got 0";
    cases.push_back(c);
  }

  // The MoE layers: the MoeConfig fields and each layer's own.
  const MoeConfig m = make_moe_config(16, 8 * W, 2 * W, 2);
  auto ep = [](Communicator& comm, const MoeConfig& c) { EpMoe layer(comm, c, 6); };
  auto tp = [](Communicator& comm, const MoeConfig& c) { TpMoe layer(comm, c, 6); };
  using M = MoeConfig;
  for (const char* layer : {"EpMoe", "TpMoe"}) {
    auto add = [&](std::string field, std::function<void(M&)> change, std::string values) {
      if (std::string(layer) == "EpMoe")
        cases.push_back(mismatch<M>(layer, field, m, change, values, ep));
      else
        cases.push_back(mismatch<M>(layer, field, m, change, values, tp));
    };
    add("hidden_dim", [](M& c) { c.hidden_dim = 24; }, on("16", "24"));
    add("ffn_dim", [W](M& c) { c.ffn_dim = 16 * W; },
        on(std::to_string(8 * W), std::to_string(16 * W)));
    add("output_dim", [](M& c) { c.output_dim = 8; }, "8 on rank " + odd + "; 16 on " + others);
    add("num_experts", [W](M& c) { c.num_experts = 4 * W; },
        on(std::to_string(2 * W), std::to_string(4 * W)));
    add("top_k", [](M& c) { c.top_k = 1; }, "1 on rank " + odd + "; 2 on " + others);
    add("act", [](M& c) { c.act = Activation::gelu; }, on("relu", "gelu"));
    add("dtype", [](M& c) { c.dtype = DType::bf16; }, on("f32", "bf16"));
    add("seed", [](M& c) { c.seed += 1; },
        on(std::to_string(m.seed), std::to_string(m.seed + 1)));
  }
  {
    AgreementCase c;
    c.name = "EpMoe.max_tokens";
    c.build = [m](Communicator& comm, bool is_odd) { EpMoe layer(comm, m, is_odd ? 7 : 6); };
    c.expected = "the ranks' configs differ in max_tokens (" + on("6", "7") + ")";
    cases.push_back(c);
    c.name = "EpMoe.micro_batches";
    c.build = [m](Communicator& comm, bool is_odd) { EpMoe layer(comm, m, 6, is_odd ? 2 : 1); };
    c.expected = "the ranks' configs differ in micro_batches (" + on("1", "2") + ")";
    cases.push_back(c);
    c.name = "TpMoe.max_tokens";
    c.build = [m](Communicator& comm, bool is_odd) { TpMoe layer(comm, m, is_odd ? 7 : 6); };
    c.expected = "the ranks' configs differ in max_tokens (" + on("6", "7") + ")";
    cases.push_back(c);
    c.name = "TpMoe.rejected_on_one_rank";
    c.build = [m](Communicator& comm, bool is_odd) {
      MoeConfig config = m;
      if (is_odd) config.top_k = 0;
      TpMoe layer(comm, config, 6);
    };
    c.expected_on_odd_rank = "MoeConfig: top_k = 0 must be in 1..num_experts";
    c.expected = "rank " + odd + " rejected its config (" + c.expected_on_odd_rank;
    cases.push_back(c);
  }

  // The overlap ops.
  using O = OverlapConfig;
  const O o = make_overlap_config(12 * W, 12 * W, 12 * W, DType::bf16);
  auto agg = [](Communicator& comm, const O& c) { AllGatherGemm op(comm, c); };
  auto grs = [](Communicator& comm, const O& c) { GemmReduceScatter op(comm, c); };
  for (bool gather : {true, false}) {
    const std::string object = gather ? "AllGatherGemm" : "GemmReduceScatter";
    auto add = [&](std::string field, std::function<void(O&)> change, std::string values) {
      if (gather)
        cases.push_back(mismatch<O>(object, field, o, change, values, agg));
      else
        cases.push_back(mismatch<O>(object, field, o, change, values, grs));
    };
    const std::string size = std::to_string(12 * W), twice = std::to_string(24 * W);
    add("M", [W](O& c) { c.m = 24 * W; }, on(size, twice));
    add("N", [W](O& c) { c.n = 24 * W; }, on(size, twice));
    add("K", [W](O& c) { c.k = 24 * W; }, on(size, twice));
    add("dtype", [](O& c) { c.dtype = DType::f32; }, "f32 on rank " + odd + "; bf16 on " + others);
    add("chunks", [W](O& c) { c.chunks = 2 * W; }, on("0", std::to_string(2 * W)));
    add("min_overlap_bytes", [](O& c) { c.min_overlap_bytes = 64; }, on("0", "64"));
    add("order", [](O& c) { c.order = OverlapOrder::ring; }, on("all-pairs", "ring"));
  }
  return cases;
}

std::string check_agreement_case(Communicator& comm, const AgreementCase& c) {
  const bool odd = comm.rank() == comm.size() - 1;
  const std::string& expected =
      odd && !c.expected_on_odd_rank.empty() ? c.expected_on_odd_rank : c.expected;
  try {
    c.build(comm, odd);
  } catch (const Error& e) {
    const std::string message = e.what();
    if (message.find(expected) != std::string::npos) return "";
    return c.name + " on rank " + std::to_string(comm.rank()) + ": expected an error with \"" +
           expected + "\", got \"" + message + "\"";
  }
  return c.name + " on rank " + std::to_string(comm.rank()) + ": built without an error";
}

}  // namespace pmoe::testing
