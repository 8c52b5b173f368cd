// MoE layer test cases shared by the thread tests and the MPI tests: the same case runs on any
// Communicator and checks every forward against the plain reference.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "pmoe/comm.hpp"
#include "pmoe/moe.hpp"

namespace pmoe::testing {

enum class MoeVariant : uint8_t { simple, tp, ep };
const char* variant_name(MoeVariant v);

struct MoeCase {
  MoeConfig config;
  MoeVariant variant = MoeVariant::simple;
  int batch = 8;          // tokens of the whole batch (EP shards them, TP replicates them)
  int micro_batches = 1;  // EpMoe only
  ExpertPlacement placement{};  // EpMoe only: slots and the experts they serve (replicas)
  int calls = 1;          // forwards on one layer; call i runs batch - (i % 3) tokens (>= 0)
  uint64_t input_seed = 7;
  // Where the layer runs: the CPU, or the communicator's CUDA device (x and y are copied there
  // and back around each forward, which runs on comm.stream()).
  Device device = Device::cpu();
};

// A small config: H = feature, F = ffn, E experts, top-k, the given activation and dtype.
// Rows per expert when `tokens` tokens each pick top_k distinct experts of `experts`, expert e
// with weight 1 / (e + 1)^s (Zipf routing), drawn from `rng`.
std::vector<int32_t> zipf_expert_counts(int experts, int top_k, int tokens, double s,
                                        std::mt19937& rng);

MoeConfig make_moe_config(int feature, int ffn, int experts, int top_k,
                          Activation act = Activation::relu, DType dtype = DType::f32,
                          int output = 0);

struct MoeCaseResult {
  std::string error;     // "" when every call matched the reference on this rank
  int compared = 0;      // rows compared, over all calls
  int skipped = 0;       // rows skipped for a top-k tie
  std::vector<float> y;  // this rank's output of the last call, as f32
  MoeStats stats;        // this rank's layer's last_stats() after the last call
};

// Runs the case on `comm` (collective; every rank gets the same case) and checks it. TP also
// checks that every rank's output has the same bits.
MoeCaseResult run_moe_case(Communicator& comm, const MoeCase& c);

std::string describe(const MoeCase& c, int world_size);

}  // namespace pmoe::testing
