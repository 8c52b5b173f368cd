// The MoE layers' index kernels (moe_kernels.cuh): where each token's rows go, computed on the
// device so that a forward reads nothing back to the host; moe_row_kernels.cu moves the rows.
//
//   router:   logits [m, E] f32 --top_k_softmax--> indices [m, k] i32, weights [m, k] f32
//   grouping: indices --group_pairs--> counts [E], token_of_row [E, C], row_of_pair [m, k]
//   experts:  counts --plan_tiles--> each GEMM operand's tile addresses (device_experts.hpp)
//
// C is an expert's capacity of rows (moe_row_kernels.cu). And count_ep_rows: EpMoe's count of the
// rows a call moves (moe/ep_traffic.hpp).
#include "cuda/moe/moe_kernels.cuh"

#include <algorithm>

#include "cuda/launch.cuh"
#include "cuda/memory_ops.cuh"
#include "cuda/moe/moe_kernel_helpers.cuh"
#include "moe/ep_traffic.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

__global__ void __launch_bounds__(kBlockThreads) top_k_softmax_kernel(const TopKSoftmax t) {
  const int E = t.num_experts, k = t.top_k;
  for (int64_t token = first_index(); token < t.m; token += grid_step()) {
    const float* l = t.logits + token * E;
    int32_t* idx = t.indices + token * k;
    float* w = t.weights + token * k;
    // Slot j takes the best expert not taken by slots before it (k <= E, so one always exists).
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken = taken || idx[i] == e;
        if (!taken && (best < 0 || l[e] > l[best])) best = e;
      }
      idx[j] = best;  // read back by this thread only
    }
    const float top = l[idx[0]];
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      w[j] = expf(l[idx[j]] - top);
      sum += w[j];
    }
    for (int j = 0; j < k; ++j) w[j] /= sum;
  }
}

// A block an expert (grid-stride over the experts): thread i takes the i-th 256th of the pairs,
// in pair order; it counts its pairs of the expert, a block scan places its first row after the
// threads before it, and a second pass writes them. So the rows keep pair (token) order, as the
// one-thread-an-expert walk did, and each thread reads 2 ceil(m k / 256) indices an expert.
__global__ void __launch_bounds__(kBlockThreads, kBlocksPerSm) group_pairs_kernel(const GroupPairs g) {
  __shared__ int32_t ends[kBlockThreads];
  const int pairs = g.m * g.top_k;
  const int share = (pairs + kBlockThreads - 1) / kBlockThreads;
  const int begin = min(pairs, int(threadIdx.x) * share), end = min(pairs, begin + share);
  for (int e = int(blockIdx.x); e < g.num_experts; e += int(gridDim.x)) {
    int32_t mine = 0;
    for (int p = begin; p < end; ++p) mine += g.indices[p] == e ? 1 : 0;
    count_serial_steps(end - begin);
    block_inclusive_scan(ends, mine);
    int32_t row = int32_t(e) * g.capacity + ends[threadIdx.x] - mine;
    int token = begin / g.top_k, slot = begin - token * g.top_k;
    for (int p = begin; p < end; ++p) {
      if (g.indices[p] == e) {
        store_global(g.token_of_row + row, int32_t(token));
        store_global(g.row_of_pair + p, row);
        ++row;
      }
      if (++slot == g.top_k) {
        slot = 0;
        ++token;
      }
    }
    count_serial_steps(end - begin);
    if (threadIdx.x == kBlockThreads - 1) store_global(g.counts + e, ends[threadIdx.x]);
    __syncthreads();  // `ends` is read above before the next expert's scan writes it
  }
}

// Thread 0 numbers the tiles (a prefix sum over the groups); then each thread writes its groups'
// tiles, and the dead tiles after the live ones. first_tile is the block's own scratch, so plain
// stores and the barrier publish it (store_to_peer is for what later kernels read).
__global__ void __launch_bounds__(kBlockThreads) plan_tiles_kernel(const PlanTiles p) {
  if (threadIdx.x == 0) {
    int32_t tiles = 0;
    int64_t used = 0;
    for (int g = 0; g < p.groups; ++g) {
      p.first_tile[g] = tiles;
      tiles += (p.counts[g] + p.tile - 1) / p.tile;
      used += p.counts[g];
    }
    p.first_tile[p.groups] = tiles;
    if (p.tally != nullptr) {
      p.tally[0] = used;
      p.tally[1] = int64_t(tiles) * p.tile;
    }
  }
  __syncthreads();  // first_tile, written by thread 0, is read by every thread
  for (int g = int(threadIdx.x); g < p.groups; g += blockDim.x) {
    const int32_t first = p.first_tile[g], end = min(p.first_tile[g + 1], p.max_tiles);
    const int32_t last_start = max(p.counts[g], p.tile) - p.tile;
    for (int32_t t = first; t < end; ++t) {
      const int64_t row = g * p.group_rows + min((t - first) * p.tile, last_start);
      for (const TileOperand& o : p.operands)
        store_to_peer(o.tiles + t, static_cast<const void*>(static_cast<const char*>(o.base) +
                                                           (o.per_group ? g : row) * o.step));
    }
  }
  const int32_t live = p.first_tile[p.groups];
  for (int32_t t = live + int32_t(threadIdx.x); t < p.max_tiles; t += blockDim.x)
    for (const TileOperand& o : p.operands) store_to_peer(o.tiles + t, o.dead);
}

// Each thread sums its tokens, thread 0 the threads' sums in thread order.
__global__ void __launch_bounds__(kBlockThreads) count_ep_rows_kernel(const CountEpRows c) {
  __shared__ int64_t partial[kBlockThreads];
  int64_t rows = 0;
  for (int t = int(threadIdx.x); t < c.m; t += kBlockThreads)
    rows += ::pmoe::detail::ep_token_rows_moved(c.indices + int64_t(t) * c.top_k, c.top_k,
                                                c.num_experts, c.num_local, c.rank);
  partial[threadIdx.x] = rows;
  __syncthreads();
  if (threadIdx.x != 0) return;
  int64_t total = 0;
  for (int i = 0; i < kBlockThreads; ++i) total += partial[i];
  *c.rows = total;
}

}  // namespace

void launch_top_k_softmax(const TopKSoftmax& t, cudaStream_t stream) {
  if (t.m == 0) return;
  launch("moe_top_k_softmax", top_k_softmax_kernel, blocks_for(t.m), stream, t);
}

void launch_group_pairs(const GroupPairs& g, cudaStream_t stream) {
  if (g.num_experts == 0) return;
  launch("moe_group_pairs", group_pairs_kernel, std::min(g.num_experts, full_grid()), stream, g);
}

void launch_plan_tiles(const PlanTiles& p, cudaStream_t stream) {
  if (p.max_tiles == 0) return;
  launch(plan_tiles_kernel, 1, stream, p);
}

void launch_count_ep_rows(const CountEpRows& c, cudaStream_t stream) {
  launch(count_ep_rows_kernel, 1, stream, c);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
