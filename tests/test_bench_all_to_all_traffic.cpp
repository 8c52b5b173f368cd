// Host only, reading what a pmoe-bench run wrote: `pmoe-bench all-to-all --device cuda
// --ranks-per-node N --json F` (thread ranks on the emulated GPU, split into nodes; ctest runs
// it first, tests/CMakeLists.txt) reports per op and per rank the bytes and transfers the remote
// path measured; they must equal count_traffic (src/all_to_all/traffic.hpp) of the routing the
// bench ran, rebuilt here from the JSON's config and seed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "all_to_all/traffic.hpp"
#include "pmoe/dtype.hpp"
#include "pmoe/error.hpp"
#include "reference/workload.hpp"

namespace pmoe::testing {
namespace {

using detail::Link;
using nlohmann::json;

// The config pmoe-bench all-to-all --device cuda runs (all_to_all_bench.cpp, config_for).
AllToAllConfig bench_config(const json& config, int tokens) {
  AllToAllConfig c;
  c.max_tokens = tokens;
  c.num_experts = config.at("experts").get<int>();
  c.top_k = config.at("topk").get<int>();
  c.hidden_dim = config.at("hidden").get<int>();
  c.in_dtype = parse_dtype(config.at("dtype").get<std::string>());
  c.scale_block = c.in_dtype == DType::f8e4m3 ? 128 : 0;
  c.out_dtype = parse_dtype(config.at("out_dtype").get<std::string>());
  c.ranks_per_node = config.at("ranks_per_node").get<int>();
  return c;
}

TEST(BenchAllToAllTraffic, MeasuredNetworkBytesEqualCountTraffic) {
  const char* path = std::getenv("PMOE_BENCH_JSON");
  ASSERT_NE(path, nullptr) << "PMOE_BENCH_JSON: the JSON a pmoe-bench all-to-all run wrote";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  const json doc = json::parse(in);
  const json& config = doc.at("config");
  ASSERT_EQ(config.at("device"), "cuda");
  ASSERT_GT(config.at("ranks_per_node").get<int>(), 0) << "the run must split the ranks into nodes";
  const auto mode = config.at("mode") == "hierarchical" ? detail::TrafficMode::hierarchical
                                                        : detail::TrafficMode::direct;
  int checked = 0;
  uint64_t network = 0;
  for (const json& row : doc.at("rows")) {
    const std::string op = row.at("op");
    if (op != "dispatch" && op != "combine") continue;
    const int W = row.at("ranks").get<int>(), tokens = row.at("tokens").get<int>();
    const AllToAllConfig c = bench_config(config, tokens);
    std::vector<std::vector<int32_t>> indices;
    for (int r = 0; r < W; ++r) {
      const auto inputs = reference::make_inputs(c, r, tokens, config.at("seed").get<uint64_t>(),
                                                 reference::Routing::random);
      const int32_t* first = inputs.indices.data<int32_t>();
      indices.emplace_back(first, first + inputs.indices.tensor().numel());
    }
    // The bench's expert_y is bf16.
    const detail::Traffic counted =
        detail::count_traffic(c, {W, c.ranks_per_node, mode, false}, indices, DType::bf16);
    const detail::OpTraffic& t = op == "dispatch" ? counted.dispatch : counted.combine;
    const json& per_rank = row.at("per_rank");
    ASSERT_EQ(per_rank.size(), size_t(W));
    for (int r = 0; r < W; ++r) {
      SCOPED_TRACE(detail::cat(op, ", ", W, " ranks, ", tokens, " tokens, rank ", r));
      const json& measured = per_rank[size_t(r)].at("network_measured");
      const detail::LinkCount want = t.ranks[size_t(r)].sent[int(Link::network)];
      EXPECT_EQ(measured.at("bytes").get<uint64_t>(), want.bytes);
      EXPECT_EQ(measured.at("transfers").get<uint64_t>(), want.transfers);
      // The counted links the bench wrote are count_traffic's.
      EXPECT_EQ(per_rank[size_t(r)].at("load_store_counted").at("bytes").get<uint64_t>(),
                t.ranks[size_t(r)].sent[int(Link::load_store)].bytes);
      network += want.bytes;
    }
    ++checked;
  }
  EXPECT_GE(checked, 2) << "no dispatch and combine rows in " << path;
  EXPECT_GT(network, 0u) << "nothing crossed a node";
}

}  // namespace
}  // namespace pmoe::testing
