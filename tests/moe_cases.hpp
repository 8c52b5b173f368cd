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

// One EpMoe forward of this rank's shard of a `batch`-token input made from `seed`, compared with
// the reference for those tokens: "" or what differs. On a device, x and y go through
// `device_x` and `device_y` (this rank's most tokens, made once: freeing device memory waits for
// the whole device, where the peers' kernels may wait for this rank), and check_errors() runs
// after the stream. PeerLost and other errors propagate.
std::string forward_ep_shard(EpMoe& ep, Communicator& comm, int batch, uint64_t seed,
                             const Buffer* device_x = nullptr, const Buffer* device_y = nullptr);

// EpMoe with on_peer_loss = mask on 4 thread ranks of `device`, every expert on two of them:
// rank 3 stops after two forwards and nobody masks it; the others find it lost after
// `peer_timeout_s`, lose one forward (PeerLost) and then match the reference with its replicas;
// two forwards later they unmask it, it rejoins, and the layer is whole again. With two
// micro-batches the half whose exchange did not raise the loss goes on without rank 3 too.
void expect_ep_moe_loses_a_rank_and_takes_it_back(Device device, int micro_batches,
                                                  double peer_timeout_s);

}  // namespace pmoe::testing
