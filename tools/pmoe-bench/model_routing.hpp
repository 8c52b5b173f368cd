// The routings the scaling model counts: k distinct experts per token, drawn uniformly or with
// Zipf weights 1 / (e + 1)^s (expert 0 the hottest; it lives on rank 0), or read from a recorded
// top-k file (whitespace-separated expert ids, k per token; rank r takes tokens r*m .. r*m+m-1,
// wrapping around the file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pmoe::bench {

// spec: "uniform", "zipf:S" (S > 0) or "file:PATH". Throws pmoe::Error naming --routing.
std::vector<std::vector<int32_t>> make_routing(const std::string& spec, int world_size,
                                               int tokens_per_rank, int top_k, int num_experts,
                                               uint64_t seed);

}  // namespace pmoe::bench
