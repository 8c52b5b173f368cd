#include "reference/workload.hpp"

#include <numeric>
#include <vector>

#include "pmoe/error.hpp"

namespace pmoe::reference {

uint64_t hash64(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  // splitmix64 finaliser over a mix of the inputs.
  uint64_t z = seed ^ (a * 0x9e3779b97f4a7c15ull) ^ (b * 0xc2b2ae3d27d4eb4full) ^
               (c * 0x165667b19e3779f9ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  return float(hash64(seed, a, b, c) >> 40) * (1.0f / float(1 << 24));
}

Routing parse_routing(std::string_view name) {
  if (name == "random") return Routing::random;
  if (name == "hot_expert") return Routing::hot_expert;
  if (name == "hot_last_expert") return Routing::hot_last_expert;
  if (name == "dropped") return Routing::dropped;
  throw Error(detail::cat("unknown routing '", name, "': expected random, hot_expert, hot_last_expert or dropped"));
}

AllToAllInputs make_inputs(const AllToAllConfig& config, int rank, int m, uint64_t seed,
                           Routing routing) {
  const int H = config.hidden_dim, k = config.top_k, E = config.num_experts;
  const int S = config.scales_per_token();
  // Streams of the generator, so that x, scales and routing never share random numbers.
  enum : uint64_t { kX = 1, kScale, kExpert, kDrop, kWeight };
  const uint64_t base = hash64(seed, uint64_t(rank));

  AllToAllInputs in;
  in.m = m;
  in.x = Buffer(config.in_dtype, {m, H});
  in.has_scales = config.in_dtype == DType::f8e4m3;
  if (in.has_scales) in.x_scale = Buffer(DType::f32, {m, S});
  in.indices = Buffer(DType::i32, {m, k});
  in.weights = Buffer(DType::f32, {m, k});

  visit_float_dtype(config.in_dtype, [&](auto tag) {
    using T = decltype(tag);
    T* x = in.x.data<T>();
    for (int t = 0; t < m; ++t)
      for (int h = 0; h < H; ++h)
        x[size_t(t) * H + h] = from_float<T>(4.0f * uniform(base, kX, t, h) - 2.0f);
  });
  if (S) {
    float* scale = in.x_scale.data<float>();
    for (int t = 0; t < m; ++t)
      for (int s = 0; s < S; ++s) scale[t * S + s] = 0.5f + 1.5f * uniform(base, kScale, t, s);
  }

  int32_t* indices = in.indices.data<int32_t>();
  float* weights = in.weights.data<float>();
  std::vector<int32_t> experts(static_cast<size_t>(E));
  for (int t = 0; t < m; ++t) {
    // A partial Fisher-Yates shuffle picks k distinct experts.
    std::iota(experts.begin(), experts.end(), 0);
    int first = 0;
    if (routing == Routing::hot_expert) first = 1;  // expert 0 stays in slot 0
    if (routing == Routing::hot_last_expert) {        // expert E - 1 goes to slot 0 and stays
      std::swap(experts[0], experts[size_t(E - 1)]);
      first = 1;
    }
    for (int j = first; j < k; ++j) {
      const int pick = j + int(hash64(base, kExpert, t, j) % uint64_t(E - j));
      std::swap(experts[size_t(j)], experts[size_t(pick)]);
    }
    for (int j = 0; j < k; ++j) {
      const bool drop =
          routing == Routing::dropped && uniform(base, kDrop, t, j) < 0.25f;
      indices[t * k + j] = drop ? -1 : experts[size_t(j)];
      weights[t * k + j] = 0.05f + uniform(base, kWeight, t, j);
    }
  }
  return in;
}

}  // namespace pmoe::reference
