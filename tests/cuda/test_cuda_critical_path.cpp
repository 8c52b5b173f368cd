// The critical path of AllToAll's kernels, counted on the emulated device (which cannot time
// them): 1 rank and 8 ranks sharing one emulated GPU, DeepSeek-V3's shape (256 experts, top-8,
// hidden 7168, bf16), 1, 128 and 1024 tokens, fused and split phases, the caller's buffers and
// the op's in-place ones. Each kernel's barrier rounds, blocks waiting on their own grid and
// serial steps are held to the budgets that docs/gpu-all-to-all.md derives, no kernel fences at
// system scope (every peer shares the GPU), and each op's bytes (counted where the kernels load
// and store) to the least the routing needs. Every call is checked against the reference, so a
// kernel that meets its budget by skipping work fails too. Emulator only: a GPU counts nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cuda/all_to_all/device_utils.cuh"  // before <cuda_runtime.h>: see params.cuh

#include <cuda_runtime.h>

#include "all_to_all_cases.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "cuda/launch.cuh"
#include "cuda/sm_count.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/diagnostics/kernel_counts.hpp"

namespace pmoe::testing {
namespace {

// What one kernel may cost at most, from the design in docs/gpu-all-to-all.md ("Critical
// path"). Blocks that wait on another block of their own grid: none, in every kernel (send_tokens
// had all but one before: every block waited for the one that routed).
struct Budget {
  int barrier_rounds;
  int64_t serial_steps;
};

struct Counted {
  std::vector<KernelCounts> kernels;
  uint64_t least_dispatch_bytes = 0, least_combine_bytes = 0;  // summed over the ranks
};

// W ranks sharing emulated GPU 0, `tokens` tokens each at DeepSeek-V3's shape. In place: the
// tokens and expert outputs in the op's own buffers, as an MoE layer passes them.
// How an op is made maskable, if at all.
enum class Maskable { no, rank_mask, on_peer_loss };

Counted counted_case(int W, int tokens, bool split, bool in_place = false, int hidden = 7168,
                     Maskable maskable = Maskable::no) {
  AllToAllCase c;
  c.config = make_config(tokens, 256, 8, hidden, DType::bf16, DType::bf16);
  c.config.in_place_buffers = in_place;
  c.config.rank_mask = maskable == Maskable::rank_mask;
  if (maskable == Maskable::on_peer_loss) c.config.on_peer_loss = OnPeerLoss::mask;
  c.in_place = in_place;
  c.tokens = TokenCounts::full;
  c.split_phases = split;
  c.device = Device::cuda(0);
  std::vector<CaseResult> results(static_cast<size_t>(W));
  start_counting_kernels();
  run_ranks(
      W, [&](Communicator& comm) { results[size_t(comm.rank())] = run_all_to_all_case(comm, c); },
      Device::cuda(0));
  Counted counted;
  counted.kernels = stop_counting_kernels();
  for (int r = 0; r < W; ++r) {
    EXPECT_EQ(results[size_t(r)].error, "") << "rank " << r;
    counted.least_dispatch_bytes += results[size_t(r)].least_dispatch_bytes;
    counted.least_combine_bytes += results[size_t(r)].least_combine_bytes;
  }
  return counted;
}

void expect_within(const Counted& counted, const std::map<std::string, Budget>& budgets,
                   const std::string& where) {
  const std::vector<KernelCounts>& counts = counted.kernels;
  std::vector<std::string> seen;
  for (const KernelCounts& k : counts) {
    std::printf("  %-24s %-14s grid %4u  barrier rounds %4d  own-grid waits %4d  spun %4d  "
                "serial steps %8lld  system fences %3d  bytes %11lld\n",
                where.c_str(), k.kernel.c_str(), k.blocks, k.barrier_rounds,
                k.blocks_waiting_on_own_grid, k.blocks_that_spun, (long long)k.serial_steps,
                k.system_fences, (long long)(k.total_bytes_read + k.total_bytes_written));
    seen.push_back(k.kernel);
    EXPECT_EQ(k.blocks_waiting_on_own_grid, 0) << where << ": " << k.kernel;
    // Every rank is a thread on one GPU: device scope orders everything they share.
    EXPECT_EQ(k.system_fences, 0) << where << ": " << k.kernel;
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
int grid_blocks() { return cuda::grid_blocks(cuda::sm_count(0)); }

// W ranks, `tokens` tokens each, top-8 of 256 experts.
std::map<std::string, Budget> budgets(int W, int tokens) {
  // Ranks sharing the device launch their share of its grid.
  const int64_t E = 256, k = 8, L = E / W, G = std::max(1, grid_blocks() / W);
  const int64_t per_block = ceil_div(tokens, std::min<int64_t>(G, tokens));  // send_tokens' run
  const int64_t received = int64_t(W) * tokens;               // slots a rank may receive
  const int64_t rows = received * std::min<int64_t>(k, L);    // rows it may land
  // send_tokens: the go barrier; a table clear, the walk over earlier tokens and one barrier per
  // token of the block's run; the last block's barriers (counting in, the heads, the totals
  // cleared), then receive_heads' three (for Phase::both). Serial: the walk (a share of the
  // earlier tokens, k entries each), a top-k slot per thread per token (k-long checks), each
  // token's copies to at most min(k, W) ranks, the heads (a share of each rank's expert counts),
  // the totals cleared, and receive_heads' sums, scan and source ends.
  const int64_t head_steps = W * ceil_div(L, 256) + ceil_div(E, 256);
  const int64_t receive_steps = ceil_div(L, 256) * (W + 2) + W + 8;
  const int64_t send_steps = ceil_div(tokens, 256) * k + per_block * k +
                             per_block * std::min<int64_t>(k, W) * kRowSteps + head_steps +
                             receive_steps;
  return {
      {"send_tokens", {int(12 + per_block), send_steps}},
      // The step check's barrier, the waits' and the scan's one: a thread per expert run (W + 1
      // steps each, then one), the scan (8 warps' sums), a thread per source (up to W steps).
      {"route_rows", {3, receive_steps}},
      // No barrier; each block's share of the slots, a row copy per pair, and the search for
      // the slots' sources (which goes on from slot to slot).
      {"land_rows", {0, ceil_div(received, G) * std::min<int64_t>(k, L) * kRowSteps + W}},
      // Each block's share of the rows, a copy each; the last block's two barriers, then (for
      // Phase::both) one before the fused wait and its two.
      {"return_rows", {5, ceil_div(rows, G) * kRowSteps}},
      {"await_owners", {2, W}},
      // A token per block: its k rows looked up by k threads (one barrier), then summed, a
      // row's words spread over the block.
      {"reduce_rows", {int(ceil_div(tokens, G)), ceil_div(tokens, G) * k * kRowSteps}},
  };
}

// The bytes each op moved, summed over its kernels and ranks, over the least the routing needs.
struct OpBytes {
  double dispatch, combine;
};
OpBytes bytes_over_least(const Counted& counted, const std::string& where) {
  int64_t dispatch = 0, combine = 0;
  for (const KernelCounts& k : counted.kernels) {
    const int64_t moved = k.total_bytes_read + k.total_bytes_written;
    if (k.kernel == "send_tokens" || k.kernel == "route_rows" || k.kernel == "land_rows")
      dispatch += moved;
    else if (k.kernel == "return_rows" || k.kernel == "await_owners" || k.kernel == "reduce_rows")
      combine += moved;
  }
  const OpBytes ratio{double(dispatch) / double(counted.least_dispatch_bytes),
                      double(combine) / double(counted.least_combine_bytes)};
  std::printf("  %-24s dispatch %lld B (%.3fx the least)  combine %lld B (%.3fx the least)\n",
              where.c_str(), (long long)dispatch, ratio.dispatch, (long long)combine,
              ratio.combine);
  return ratio;
}

TEST(CriticalPath, DeepSeekV3ShapeOnOneRank) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  for (int tokens : {1, 128})
    for (bool split : {false, true}) {
      const std::string where = "W1 " + std::to_string(tokens) + (split ? " split" : " fused");
      const Counted counted = counted_case(1, tokens, split);
      expect_within(counted, budgets(1, tokens), where);
      if (tokens == 1 || split) continue;
      // The caller's own buffers: each token (row) moves once more, through the receiver's slot
      // (the source's combine area). Dispatch: x read, slot written and read, 8 rows written:
      // (1 + 1 + 1 + 8) / (1 + 8). Combine: 8 rows read, written there and read again, y
      // written: (3 * 8 + 1) / (8 + 1).
      const OpBytes ratio = bytes_over_least(counted, where + " copies");
      EXPECT_LE(ratio.dispatch, 1.25) << where;
      EXPECT_LE(ratio.combine, 2.85) << where;
    }
}

// With the op's own buffers (as an MoE layer passes them) each byte moves once: dispatch reads
// each token once per rank it goes to, in place at its source, and writes each expert row once;
// combine reads each expert row once, in place at its owner, and writes y. What else moves
// (headers, heads, row refs, weights) stays under 15% at 128 tokens and up.
void expect_each_byte_once(int W, int tokens, int hidden = 7168) {
  const std::string where = "W" + std::to_string(W) + " " + std::to_string(tokens) + " in place" +
                            (hidden == 7168 ? "" : " H " + std::to_string(hidden));
  const Counted counted = counted_case(W, tokens, W > 1, /*in_place=*/true, hidden);
  if (hidden == 7168) expect_within(counted, budgets(W, tokens), where);
  const OpBytes ratio = bytes_over_least(counted, where);
  EXPECT_LE(ratio.dispatch, 1.15) << where;
  EXPECT_LE(ratio.combine, 1.15) << where;
  EXPECT_GE(ratio.dispatch, 1.0) << where << ": fewer bytes than the least; a copy is missing";
  EXPECT_GE(ratio.combine, 1.0) << where << ": fewer bytes than the least; a read is missing";
}

TEST(CriticalPath, InPlaceOneRank128TokensMovesEachByteOnce) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  expect_each_byte_once(1, 128);
}

// 1024 tokens at a hidden size of 2048: each of the 256 experts has room for all 1024 tokens, so
// at 7168 every expert-row buffer (expert_x, expert_y and their host copies) would take 3.8 GB.
// Headers weigh 3.5 times more against a row of 2048 than of 7168, so the bound is no looser.
TEST(CriticalPath, InPlaceOneRank1024TokensMovesEachByteOnce) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  expect_each_byte_once(1, 1024, 2048);
}

TEST(CriticalPath, InPlaceEightRanksSharingTheDeviceMoveEachByteOnce) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  expect_each_byte_once(8, 128);
}

// A kernel that copies its row twice moves twice the bytes, and the count shows it: bytes are
// counted where the copy helpers load and store, not declared beside the loops.
__global__ void copy_row(std::byte* dst, const std::byte* src, size_t bytes, int times) {
  for (int i = 0; i < times; ++i)
    cuda::copy_to_each(
        1, [](int) { return true; }, [&](int) { return dst; }, src, bytes);
}

// An op made maskable, with nobody masked, runs the same kernels as a plain one: the same grids,
// barrier rounds, serial steps, bytes and fences (the mask is a few words the waits read, and an
// eager call routes no index).
// Both ways of making an op maskable: rank_mask, and on_peer_loss = mask, whose waits also poll
// the abort word (not counted: a host-mapped word, read once in 32 polls of a wait that spins).
TEST(CriticalPath, AMaskNobodyUsesCostsNothingCounted) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const Counted plain = counted_case(2, 64, false, true, 1024);
  for (Maskable how : {Maskable::rank_mask, Maskable::on_peer_loss}) {
    SCOPED_TRACE(int(how));
    const Counted maskable = counted_case(2, 64, false, true, 1024, how);
    ASSERT_EQ(plain.kernels.size(), maskable.kernels.size());
    for (size_t i = 0; i < plain.kernels.size(); ++i) {
      const KernelCounts &a = plain.kernels[i], &b = maskable.kernels[i];
      EXPECT_EQ(a.kernel, b.kernel);
      EXPECT_EQ(a.launches, b.launches) << a.kernel;
      EXPECT_EQ(a.blocks, b.blocks) << a.kernel;
      EXPECT_EQ(a.barrier_rounds, b.barrier_rounds) << a.kernel;
      // send_tokens' most steps are its last block's, and which block comes last varies run to
      // run (its budget holds either way); every other kernel's are the same every run.
      if (a.kernel != "send_tokens") {
        EXPECT_EQ(a.serial_steps, b.serial_steps) << a.kernel;
      }
      EXPECT_EQ(a.total_bytes_read, b.total_bytes_read) << a.kernel;
      EXPECT_EQ(a.total_bytes_written, b.total_bytes_written) << a.kernel;
      EXPECT_EQ(a.system_fences, b.system_fences) << a.kernel;
    }
  }
}

TEST(CriticalPath, ARowCopiedTwiceIsCounted) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  constexpr size_t kBytes = 14336;  // one DeepSeek-V3 token in bf16
  std::byte *src = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaMalloc(&src, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, kBytes), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  int64_t moved[2] = {};
  for (int times : {1, 2}) {
    start_counting_kernels();
    cuda::launch("copy_row", copy_row, 1, stream, dst, static_cast<const std::byte*>(src), kBytes,
                 times);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<KernelCounts> counts = stop_counting_kernels();
    ASSERT_EQ(counts.size(), 1u);
    EXPECT_EQ(counts[0].bytes_read, int64_t(kBytes) * times);
    EXPECT_EQ(counts[0].bytes_written, int64_t(kBytes) * times);
    moved[times - 1] = counts[0].bytes_read + counts[0].bytes_written;
  }
  EXPECT_EQ(moved[1], 2 * moved[0]);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaFree(src), cudaSuccess);
  EXPECT_EQ(cudaFree(dst), cudaSuccess);
}

}  // namespace
}  // namespace pmoe::testing
