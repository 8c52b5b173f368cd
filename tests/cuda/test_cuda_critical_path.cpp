// The critical path of AllToAll's kernels, counted on the emulated device (which cannot time
// them): 1 rank and 8 ranks sharing one emulated GPU, DeepSeek-V3's shape (256 experts, top-8,
// hidden 7168, bf16), 1 and 128 tokens, fused and split phases. Each kernel's barrier rounds,
// blocks waiting on their own grid and serial steps are held to the budgets that
// docs/gpu-all-to-all.md derives, and every call is checked against the reference, so a kernel
// that meets its budget by skipping work fails too. Emulator only: a GPU counts nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "all_to_all_cases.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "cuda/launch.cuh"
#include "pmoe/comm.hpp"
#include "pmoe/kernel_counts.hpp"

namespace pmoe::testing {
namespace {

// What one kernel may cost at most, from the design in docs/gpu-all-to-all.md ("Critical
// path"). Blocks that wait on another block of their own grid: none, in every kernel (send_tokens
// had all but one before: every block waited for the one that routed).
struct Budget {
  int barrier_rounds;
  int64_t serial_steps;
};

std::vector<KernelCounts> counted_case(int W, int tokens, bool split) {
  AllToAllCase c;
  c.config = make_config(tokens, 256, 8, 7168, DType::bf16, DType::bf16);
  c.tokens = TokenCounts::full;
  c.split_phases = split;
  c.device = Device::cuda(0);
  std::vector<std::string> errors(static_cast<size_t>(W));
  start_counting_kernels();
  run_ranks(
      W,
      [&](Communicator& comm) { errors[size_t(comm.rank())] = run_all_to_all_case(comm, c).error; },
      Device::cuda(0));
  std::vector<KernelCounts> counts = stop_counting_kernels();
  for (int r = 0; r < W; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
  return counts;
}

void expect_within(const std::vector<KernelCounts>& counts,
                   const std::map<std::string, Budget>& budgets, const std::string& where) {
  std::vector<std::string> seen;
  for (const KernelCounts& k : counts) {
    std::printf("  %-24s %-14s grid %4u  barrier rounds %4d  own-grid waits %4d  spun %4d  "
                "serial steps %8lld\n",
                where.c_str(), k.kernel.c_str(), k.blocks, k.barrier_rounds,
                k.blocks_waiting_on_own_grid, k.blocks_that_spun, (long long)k.serial_steps);
    seen.push_back(k.kernel);
    EXPECT_EQ(k.blocks_waiting_on_own_grid, 0) << where << ": " << k.kernel;
    auto it = budgets.find(k.kernel);
    if (it == budgets.end()) {
      // Made once, at construction (the remote path's signal baselines), not per call.
      if (k.kernel != "read_signal_baselines")
        ADD_FAILURE() << where << ": no budget for " << k.kernel;
      continue;
    }
    EXPECT_LE(k.barrier_rounds, it->second.barrier_rounds) << where << ": " << k.kernel;
    EXPECT_LE(k.serial_steps, it->second.serial_steps) << where << ": " << k.kernel;
  }
  EXPECT_NE(std::find(seen.begin(), seen.end(), "send_tokens"), seen.end()) << where;
  EXPECT_NE(std::find(seen.begin(), seen.end(), "reduce_rows"), seen.end()) << where;
}

// A 7168-element bf16 row is 896 16-byte words: one pass of a 256-thread block with 4 words in
// flight per thread (4 steps) for each destination it is written to.
constexpr int64_t kRowSteps = 4;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The grid of pmoe's grid kernels on this device (src/cuda/launch.cuh's rule).
int grid_blocks() {
  int sms = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  return cuda::grid_blocks(sms);
}

// W ranks, `tokens` tokens each, top-8 of 256 experts.
std::map<std::string, Budget> budgets(int W, int tokens) {
  const int64_t k = 8, L = 256 / W, G = grid_blocks();
  const int64_t per_block = ceil_div(tokens, std::min<int64_t>(G, tokens));  // send_tokens' run
  const int64_t received = int64_t(W) * tokens;               // slots a rank may receive
  const int64_t rows = received * std::min<int64_t>(k, L);    // rows it may land
  // send_tokens: the go barrier; a table clear, the walk over earlier tokens and one barrier per
  // token of the block's run; the last block's two barriers and two of its own, then
  // receive_heads' two and its scan's 9 (for Phase::both). Serial: the walk (a share of the
  // earlier tokens, k entries of k-long checks each), a top-k slot per thread per token, each
  // token's copies to at most min(k, W) ranks, the heads and the scan (the rest).
  const int64_t send_steps = (tokens / 256 + 1) * 2 * k * k + per_block * k +
                             per_block * std::min<int64_t>(k, W) * kRowSteps + 4 * (W + 1) +
                             8 * (W + 1) + 16;
  return {
      {"send_tokens", {int(20 + per_block), send_steps}},
      // The wait, its barrier and the scan's 9: a thread per expert run (W steps each), the
      // scan, a thread per source (W steps).
      {"route_rows", {12, ceil_div(L, 256) * (W + 1) + 3 * W + 8}},
      // No barrier; each block's share of the slots, a row copy per pair, and the search for
      // each slot's source.
      {"land_rows", {0, ceil_div(received, G) * (std::min<int64_t>(k, L) * kRowSteps + W)}},
      // Each block's share of the rows, a copy each; the last block's two barriers, then (for
      // Phase::both) one before the fused wait and its two.
      {"return_rows", {5, ceil_div(rows, G) * kRowSteps}},
      {"await_owners", {2, W}},
      // A token per block: k rows summed, a row's words spread over the block.
      {"reduce_rows", {0, ceil_div(tokens, G) * k * kRowSteps}},
  };
}

TEST(CriticalPath, DeepSeekV3ShapeOnOneRank) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  for (int tokens : {1, 128})
    for (bool split : {false, true}) {
      const std::string where = "W1 " + std::to_string(tokens) + (split ? " split" : " fused");
      expect_within(counted_case(1, tokens, split), budgets(1, tokens), where);
    }
}

TEST(CriticalPath, DeepSeekV3ShapeOnEightRanksSharingTheDevice) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  expect_within(counted_case(8, 128, true), budgets(8, 128), "W8 128 split");
}

}  // namespace
}  // namespace pmoe::testing
