// AllToAll dispatch on the CUDA backend. Layout: src/all_to_all/layout.hpp (every offset below
// comes from it), scratch: params.cuh.
//
//   send:  route_tokens  (1 block)  index checks; token t's slot at each destination rank (a
//                                   prefix sum over tokens, so slots follow token order), counts
//          send_tokens   (grid)     header + payload + scales of (t, destination) into the
//                                   destination's block for this rank; the last block bumps the
//                                   epoch, writes the counts and signals every destination
//   recv:  route_rows    (1 block)  waits for every source, assigns rows ordered by (source,
//                                   token) per local expert (a prefix sum over all sources'
//                                   slots), writes counts and routes (ordered by row)
//          land_rows     (grid)     copies each routed row into expert_x (and its scales)
#include "cuda/all_to_all/device_utils.cuh"
#include "cuda/all_to_all/kernels.hpp"
#include "cuda/check.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

constexpr int kKeysPerPass = 32;  // keys rank_by_key counts at once: a 32 KiB table in __shared__
static_assert(kMaxRanks <= kBlockThreads, "route_rows gives each source one thread");

// rows[g][t] (g < n, t a thread of the block) becomes rows[g][0] + ... + rows[g][t].
template <int N>
__device__ void inclusive_scan_rows(int (&rows)[N][kBlockThreads], int n) {
  const int me = threadIdx.x;
  for (int step = 1; step < kBlockThreads; step *= 2) {
    __syncthreads();
    int add[N];
    for (int g = 0; g < n; ++g) add[g] = me >= step ? rows[g][me - step] : 0;
    __syncthreads();
    for (int g = 0; g < n; ++g) rows[g][me] += add[g];
  }
  __syncthreads();
}

// Stable ranking by key with the whole block (kBlockThreads threads, each a run of consecutive
// items). visit(item, f) calls f(key, j) for each distinct key of the item, key in
// [0, num_keys); then emit(item, key, j, rank, place) where rank counts the earlier items with
// that key and place the pairs before it in (key, item) order, and total(key, pairs) once per
// key. Returns the number of pairs. Each pass over the items counts kKeysPerPass keys per thread,
// and a prefix sum over the threads turns the counts into ranks.
template <typename Visit, typename Emit, typename Total>
__device__ int rank_by_key(int items, int num_keys, Visit visit, Emit emit, Total total) {
  __shared__ int counts[kKeysPerPass][kBlockThreads];
  const int me = threadIdx.x, per_thread = (items + kBlockThreads - 1) / kBlockThreads;
  const int begin = min(items, me * per_thread), end = min(items, begin + per_thread);
  int pairs = 0;
  for (int first = 0; first < num_keys; first += kKeysPerPass) {
    const int keys = min(kKeysPerPass, num_keys - first);
    for (int g = 0; g < keys; ++g) counts[g][me] = 0;
    for (int i = begin; i < end; ++i)
      visit(i, [&](int key, int) {
        if (key >= first && key < first + keys) ++counts[key - first][me];
      });
    inclusive_scan_rows(counts, keys);
    int rank[kKeysPerPass], place[kKeysPerPass];
    for (int g = 0; g < keys; ++g) {
      rank[g] = me > 0 ? counts[g][me - 1] : 0;
      place[g] = pairs + rank[g];
      pairs += counts[g][kBlockThreads - 1];
    }
    for (int i = begin; i < end; ++i)
      visit(i, [&](int key, int j) {
        const int g = key - first;
        if (g >= 0 && g < keys) emit(i, key, j, rank[g]++, place[g]++);
      });
    if (me < keys) total(first + me, counts[me][kBlockThreads - 1]);
    __syncthreads();  // the next pass clears the table
  }
  return pairs;
}

__global__ void __launch_bounds__(kBlockThreads) route_tokens(const AllToAllParams p) {
  const int requested = requested_tokens(p), tokens = tokens_this_call(p);
  const int k = p.top_k, W = p.world_size, L = p.num_local_experts, E = L * W;
  __shared__ bool in_order;
  __shared__ int first_bad;  // the first bad slot in row-major order: the one reported
  if (threadIdx.x == 0) {
    in_order = !failed_before(p) && step_in_order(p, Step::dispatch_send);
    first_bad = tokens * k;
  }
  __syncthreads();
  if (!in_order) return;  // send_tokens sees the fatal error and sends nothing
  if (requested != tokens && threadIdx.x == 0)
    report(p.error, kTooManyTokens, requested, Step::dispatch_send, p.m);
  // Indices the host could not check (they live on the device): out of range or repeated in a
  // row. They are reported, and the slot is treated as -1 so that peers still complete.
  for (int i = threadIdx.x; i < tokens * k; i += blockDim.x) {
    const int e = p.indices[i];
    if (e != -1 && !first_in_group(p.indices + i / k * k, i % k, E, 1)) {
      atomicMin(&first_bad, i);
      break;  // this thread's later slots come after it
    }
  }
  for (int i = threadIdx.x; i < tokens * W; i += blockDim.x) p.send_slot[i] = -1;
  // Other threads overwrite the slots of the destinations a token goes to; first_bad is final.
  __syncthreads();
  if (threadIdx.x == 0 && first_bad < tokens * k)
    report(p.error, kBadIndex, first_bad, Step::dispatch_send, p.indices[first_bad]);
  // A token's slot at a destination: the tokens before it that go there, in token order.
  rank_by_key(
      tokens, W,
      [&](int t, auto f) {
        const int32_t* row = p.indices + t * k;
        for (int j = 0; j < k; ++j)
          if (first_in_group(row, j, E, L)) f(row[j] / L, j);
      },
      [&](int t, int dest, int, int slot, int) { p.send_slot[t * W + dest] = slot; },
      [&](int dest, int count) { p.send_count[dest] = count; });
  if (threadIdx.x == 0) {
    p.round->dispatched_m = tokens;
    p.round->next_step = int32_t(Step::dispatch_recv);
  }
}

__global__ void __launch_bounds__(kBlockThreads) send_tokens(const AllToAllParams p) {
  if (failed_before(p)) return;
  const int tokens = tokens_this_call(p);
  const AllToAllLayout& lay = p.layout;
  const int k = p.top_k, E = p.num_local_experts * p.world_size;
  const size_t payload = lay.payload_bytes, scales = lay.scale_bytes;
  for (int t = blockIdx.x; t < tokens; t += gridDim.x) {
    for (int dest = 0; dest < p.world_size; ++dest) {
      const int slot = p.send_slot[t * p.world_size + dest];
      if (slot < 0) continue;
      std::byte* region = p.regions[dest];
      if (threadIdx.x == 0) {
        auto* header = reinterpret_cast<int32_t*>(region + lay.token_offset(p.rank, slot));
        int n = 0;
        const int32_t* row = p.indices + t * k;
        for (int j = 0; j < k; ++j) {
          const int e = row[j];
          if (!first_in_group(row, j, E, 1) || e / p.num_local_experts != dest) continue;
          header[AllToAllLayout::header_expert(n)] = e % p.num_local_experts;
          header[AllToAllLayout::header_slot(n)] = j;
          ++n;
        }
        header[AllToAllLayout::kHeaderToken] = t;
        header[AllToAllLayout::kHeaderPairs] = n;
      }
      block_copy(region + lay.payload_offset(p.rank, slot), p.x + size_t(t) * payload, payload);
      if (scales)
        block_copy(region + lay.scale_offset(p.rank, slot),
                   reinterpret_cast<const std::byte*>(p.x_scale) + size_t(t) * scales, scales);
    }
  }
  if (last_block(&p.block_counters[0])) {
    const uint64_t epoch = ++*p.epoch;
    for (int dest = 0; dest < p.world_size; ++dest) {
      *reinterpret_cast<int32_t*>(p.regions[dest] + lay.count_offset(p.rank)) = p.send_count[dest];
      // Payloads always travel on this backend.
      *reinterpret_cast<int32_t*>(p.regions[dest] + lay.flags_offset(p.rank)) = 0;
    }
    __threadfence_system();
    for (int dest = 0; dest < p.world_size; ++dest)
      signal_release(p.signals[dest] + lay.signal_word(lay.dispatch_signal(p.rank)), epoch);
  }
}

__global__ void __launch_bounds__(kBlockThreads) route_rows(const AllToAllParams p) {
  const uint64_t epoch = *p.epoch;
  const AllToAllLayout& lay = p.layout;
  const int W = p.world_size, L = p.num_local_experts;
  __shared__ bool failed;
  if (threadIdx.x == 0) {
    failed = failed_before(p) || !step_in_order(p, Step::dispatch_recv);
    p.round->next_step = int32_t(Step::combine_send);
  }
  __syncthreads();
  for (int source = threadIdx.x; source < W && !failed; source += blockDim.x)
    if (!wait_signal(p.signals[p.rank] + lay.signal_word(lay.dispatch_signal(source)), epoch,
                     p.timeout_ns, p.error, source, Step::dispatch_recv))
      failed = true;
  __syncthreads();
  if (failed) {
    for (int e = threadIdx.x; e < L; e += blockDim.x) p.expert_num_tokens[e] = 0;
    if (threadIdx.x == 0) *p.route_count = 0;
    return;
  }
  // Every source's slots in one list, in (source, slot) order: source s ends at ends[0][s].
  __shared__ int ends[1][kBlockThreads];
  const std::byte* region = p.regions[p.rank];
  const int me = threadIdx.x;
  ends[0][me] = 0;
  if (me < W) ends[0][me] = *reinterpret_cast<const int32_t*>(region + lay.count_offset(me));
  inclusive_scan_rows(ends, 1);
  struct Slot {
    int source, slot;
    const int32_t* header;
  };
  auto slot_at = [&](int i) {
    int source = 0;
    while (ends[0][source] <= i) ++source;
    const int slot = i - (source > 0 ? ends[0][source - 1] : 0);
    return Slot{source, slot,
                reinterpret_cast<const int32_t*>(region + lay.token_offset(source, slot))};
  };
  // An expert's rows in (source, token) order, as slots are in token order; routes in (expert,
  // row) order.
  const int routes = rank_by_key(
      ends[0][W - 1], L,
      [&](int i, auto f) {
        const int32_t* h = slot_at(i).header;
        for (int q = 0; q < h[AllToAllLayout::kHeaderPairs]; ++q)
          f(h[AllToAllLayout::header_expert(q)], h[AllToAllLayout::header_slot(q)]);
      },
      [&](int i, int expert, int j, int position, int route) {
        const Slot s = slot_at(i);
        p.routes[route] = Route{s.source, s.header[AllToAllLayout::kHeaderToken], j,
                                int32_t(expert * p.rows_per_expert + position), s.slot};
      },
      [&](int expert, int rows) { p.expert_num_tokens[expert] = rows; });
  if (me == 0) *p.route_count = routes;
}

__global__ void __launch_bounds__(kBlockThreads) land_rows(const AllToAllParams p) {
  const int routes = *p.route_count;
  const AllToAllLayout& lay = p.layout;
  const size_t payload = lay.payload_bytes, scales = lay.scale_bytes;
  const std::byte* region = p.regions[p.rank];
  for (int r = blockIdx.x; r < routes; r += gridDim.x) {
    const Route route = p.routes[r];
    block_copy(p.expert_x + size_t(route.row) * payload,
               region + lay.payload_offset(route.source, route.src_slot), payload);
    if (scales)
      block_copy(reinterpret_cast<std::byte*>(p.expert_x_scale) + size_t(route.row) * scales,
                 region + lay.scale_offset(route.source, route.src_slot), scales);
  }
}

}  // namespace

void launch_dispatch_send(const AllToAllParams& p, cudaStream_t stream, int blocks) {
  launch(route_tokens, 1, stream, p);
  launch(send_tokens, blocks, stream, p);
}

void launch_dispatch_recv(const AllToAllParams& p, cudaStream_t stream, int blocks) {
  launch(route_rows, 1, stream, p);
  launch(land_rows, blocks, stream, p);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
