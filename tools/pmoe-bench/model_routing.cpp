// Routings for the scaling model; see model_routing.hpp.
#include "model_routing.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include "pmoe/error.hpp"

namespace pmoe::bench {

namespace {

std::vector<int32_t> read_file(const std::string& path, int top_k, int num_experts) {
  std::ifstream in(path);
  PMOE_CHECK(in, "--routing file:", path, ": cannot read it");
  std::vector<int32_t> ids;
  for (long long e; in >> e;) {
    PMOE_CHECK(e >= -1 && e < num_experts, "--routing file:", path, ": expert id ", e,
               " is not -1 or in [0, ", num_experts, ")");
    ids.push_back(int32_t(e));
  }
  PMOE_CHECK(!in.bad() && (in.eof() || in.fail()) && !ids.empty() && ids.size() % top_k == 0,
             "--routing file:", path,
             ": needs whitespace-separated expert ids, a multiple of k = ", top_k, ", got ",
             ids.size());
  return ids;
}

}  // namespace

std::vector<std::vector<int32_t>> make_routing(const std::string& spec, int world_size,
                                               int tokens_per_rank, int top_k, int num_experts,
                                               uint64_t seed) {
  PMOE_CHECK(top_k >= 1 && top_k <= num_experts, "--topk must be in [1, ", num_experts, "]");
  std::vector<std::vector<int32_t>> out(world_size);
  if (spec.rfind("file:", 0) == 0) {
    const std::vector<int32_t> ids = read_file(spec.substr(5), top_k, num_experts);
    const size_t tokens = ids.size() / top_k;
    for (int r = 0; r < world_size; ++r)
      for (int t = 0; t < tokens_per_rank; ++t) {
        const size_t row = (size_t(r) * tokens_per_rank + t) % tokens;
        out[r].insert(out[r].end(), ids.begin() + row * top_k, ids.begin() + (row + 1) * top_k);
      }
    return out;
  }
  double exponent = 0;
  if (spec.rfind("zipf:", 0) == 0) {
    try {
      exponent = std::stod(spec.substr(5));
    } catch (const std::exception&) {
      exponent = -1;
    }
    PMOE_CHECK(exponent > 0, "--routing zipf:S needs S > 0, got '", spec, "'");
  } else {
    PMOE_CHECK(spec == "uniform", "--routing must be uniform, zipf:S or file:PATH, got '", spec,
               "'");
  }
  std::vector<double> weights(num_experts);
  for (int e = 0; e < num_experts; ++e) weights[e] = 1.0 / std::pow(e + 1.0, exponent);
  std::mt19937_64 rng(seed);
  std::discrete_distribution<int> pick(weights.begin(), weights.end());
  std::vector<char> taken(num_experts);
  for (int r = 0; r < world_size; ++r) {
    for (int t = 0; t < tokens_per_rank; ++t) {
      // k distinct experts: a draw that repeats is drawn again (the same as drawing from the
      // weights left); after many repeats, from the weights left directly.
      std::fill(taken.begin(), taken.end(), 0);
      for (int j = 0; j < top_k; ++j) {
        int e = pick(rng);
        for (int tries = 0; taken[e] && tries < 64; ++tries) e = pick(rng);
        if (taken[e]) {
          std::vector<double> left = weights;
          for (int x = 0; x < num_experts; ++x)
            if (taken[x]) left[x] = 0;
          e = std::discrete_distribution<int>(left.begin(), left.end())(rng);
        }
        taken[e] = 1;
        out[r].push_back(e);
      }
    }
  }
  return out;
}

}  // namespace pmoe::bench
