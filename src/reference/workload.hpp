// Deterministic AllToAll inputs. Every value is a pure function of (seed, rank, position), so each
// rank can rebuild every other rank's inputs without communication, and the references can check
// the whole exchange from any rank, in threads or in MPI processes alike.
#pragma once

#include <cstdint>
#include <string_view>

#include "pmoe/all_to_all.hpp"

namespace pmoe::reference {

// A counter-based generator: the same (seed, a, b, c) always gives the same 64 bits.
uint64_t hash64(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0);
// Uniform in [0, 1) from hash64.
float uniform(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0);

enum class Routing : uint8_t {
  random,      // k distinct experts per token, uniformly
  hot_expert,  // slot 0 of every token is expert 0; the other slots random
  dropped,     // random, then each slot becomes -1 with probability 1/4
  // Slot 0 of every token is the last expert, E - 1; the other slots random. Last, so that the
  // values above keep their numbers (the fuzzer draws 0..2).
  hot_last_expert,
};
Routing parse_routing(std::string_view name);

// One rank's inputs for one call.
struct AllToAllInputs {
  int m = 0;
  Buffer x;        // [m, H] in_dtype
  Buffer x_scale;  // [m, H / scale_block] f32 for f8e4m3, else empty
  Buffer indices;  // [m, k] i32
  Buffer weights;  // [m, k] f32

  bool has_scales = false;  // f8e4m3 input (x_scale is then [m, S], possibly with m = 0)

  // x_scale as dispatch takes it: the scales for f8e4m3, an empty Tensor otherwise.
  Tensor x_scale_or_empty() const { return has_scales ? x_scale.tensor() : Tensor(); }
};

AllToAllInputs make_inputs(const AllToAllConfig& config, int rank, int m, uint64_t seed,
                           Routing routing);

}  // namespace pmoe::reference
