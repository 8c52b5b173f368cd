// AllToAll test cases shared by the thread tests and the MPI tests: the same case runs on any
// Communicator and is checked, call by call, against the plain reference.
#pragma once

#include <cstdint>
#include <string>

#include "pmoe/all_to_all.hpp"
#include "reference/workload.hpp"

namespace pmoe::testing {

enum class TokenCounts : uint8_t {
  full,            // every rank sends max_tokens
  random,          // 0..max_tokens, different per rank and call
  zero_on_odd,     // odd ranks send nothing; even ranks 1..max_tokens
};

struct AllToAllCase {
  AllToAllConfig config;
  reference::Routing routing = reference::Routing::random;
  TokenCounts tokens = TokenCounts::random;
  DType expert_y_dtype = DType::bf16;
  uint64_t seed = 1;
  int calls = 1;
  bool split_phases = false;  // send, other work and a barrier, then recv
  // Tokens go through the op's input buffer and expert outputs through its expert output buffer
  // (config.in_place_buffers must be set; expert outputs are then out_dtype).
  bool in_place = false;
  // Indices go in as i64 (torch.topk's type), the same values.
  bool i64_indices = false;
  // Where the op runs (the communicator's device). On a GPU, inputs are copied there and outputs
  // back, and the same host-side reference checks them.
  Device device = Device::cpu();
};

// A config with the given shape; bf16 in and out unless the caller changes it.
AllToAllConfig make_config(int max_tokens, int experts, int top_k, int hidden,
                           DType in = DType::bf16, DType out = DType::bf16, int scale_block = 0);

struct CaseResult {
  std::string error;    // "" when every call matched the reference
  uint64_t digest = 0;  // a hash of every output byte, to compare runs
  uint64_t remote_bytes = 0;  // what this rank sent to peers on other nodes (a split world)
  // The fewest bytes of global memory this rank's tokens make the exchange move, over every
  // call: dispatch reads each token once per rank it goes to and writes one row per chosen
  // expert (payload and scales); combine reads one expert_y row per chosen expert and writes y.
  uint64_t least_dispatch_bytes = 0, least_combine_bytes = 0;
};

// Runs c.calls dispatch + combine calls on `comm` (collective), reusing one AllToAll and one set
// of output buffers, and checks each call against the reference.
CaseResult run_all_to_all_case(Communicator& comm, const AllToAllCase& c);

// Human-readable name of a case's config, for failure messages.
std::string describe(const AllToAllCase& c);

// A rank's tokens, expert indices and weights, copied to `device` (a CUDA rank's inputs).
struct InputsOn {
  Buffer x, indices, weights;
};
InputsOn inputs_on(const reference::AllToAllInputs& in, Device device);

}  // namespace pmoe::testing
