// AllToAll dispatch on the CUDA backend. Layout: params.cuh (and src/cpu/all_to_all_layout.hpp).
//
//   send:  route_tokens  (1 block)  token t's slot at each destination rank, counts, index checks
//          send_tokens   (grid)     header + payload + scales of (t, destination) into the
//                                   destination's block for this rank; the last block bumps the
//                                   epoch, writes the counts and signals every destination
//   recv:  route_rows    (1 block)  waits for every source, assigns rows ordered by (source,
//                                   token) per local expert, writes counts and routes
//          land_rows     (grid)     copies each routed row into expert_x (and its scales)
#include "cuda/all_to_all/device_utils.cuh"
#include "cuda/all_to_all/kernels.hpp"
#include "cuda/check.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

constexpr int kKernelDispatchSend = 0, kKernelDispatchRecv = 1;

__global__ void route_tokens(const AllToAllParams p) {
  const int requested = requested_tokens(p), tokens = tokens_this_call(p);
  const int k = p.top_k, E = p.num_local_experts * p.world_size;
  if (requested != tokens && threadIdx.x == 0)
    report(p.error, kTooManyTokens, requested, kKernelDispatchSend, p.m);
  // Indices the host could not check (they live on the device): out of range or repeated in a
  // row. They are reported, and the slot is treated as -1 so that peers still complete.
  for (int i = threadIdx.x; i < tokens * k; i += blockDim.x) {
    const int e = p.indices[i];
    bool bad = e < -1 || e >= E;
    for (int j = i - i % k; j < i && !bad; ++j) bad = e >= 0 && p.indices[j] == e;
    if (bad) report(p.error, kBadIndex, i, kKernelDispatchSend, e);
  }
  for (int dest = threadIdx.x; dest < p.world_size; dest += blockDim.x) {
    int count = 0;
    for (int t = 0; t < tokens; ++t) {
      bool hit = false;
      for (int j = 0; j < k; ++j) {
        const int e = p.indices[t * k + j];
        bool repeated = false;
        for (int i = 0; i < j; ++i) repeated = repeated || p.indices[t * k + i] == e;
        hit = hit || (e >= 0 && e < E && !repeated && e / p.num_local_experts == dest);
      }
      p.send_slot[t * p.world_size + dest] = hit ? count++ : -1;
    }
    p.send_count[dest] = count;
  }
}

__global__ void send_tokens(const AllToAllParams p) {
  const int tokens = tokens_this_call(p);
  const int k = p.top_k, E = p.num_local_experts * p.world_size;
  for (int t = blockIdx.x; t < tokens; t += gridDim.x) {
    for (int dest = 0; dest < p.world_size; ++dest) {
      const int slot = p.send_slot[t * p.world_size + dest];
      if (slot < 0) continue;
      std::byte* token_slot = p.regions[dest] + size_t(p.rank) * p.source_block + 64 +
                              size_t(slot) * p.token_stride;
      if (threadIdx.x == 0) {
        auto* header = reinterpret_cast<int32_t*>(token_slot);
        int n = 0;
        for (int j = 0; j < k; ++j) {
          const int e = p.indices[t * k + j];
          bool repeated = false;
          for (int i = 0; i < j; ++i) repeated = repeated || p.indices[t * k + i] == e;
          if (e < 0 || e >= E || repeated || e / p.num_local_experts != dest) continue;
          header[2 + 2 * n] = e % p.num_local_experts;
          header[3 + 2 * n] = j;
          ++n;
        }
        header[0] = t;
        header[1] = n;
      }
      block_copy(token_slot + p.payload_offset_in_slot, p.x + size_t(t) * p.payload_bytes,
                 p.payload_bytes);
      if (p.scale_bytes)
        block_copy(token_slot + p.scale_offset_in_slot,
                   reinterpret_cast<const std::byte*>(p.x_scale) + size_t(t) * p.scale_bytes,
                   p.scale_bytes);
    }
  }
  if (last_block(&p.block_counters[0])) {
    const uint64_t epoch = ++*p.epoch;
    for (int dest = 0; dest < p.world_size; ++dest) {
      auto* count = reinterpret_cast<int32_t*>(p.regions[dest] + size_t(p.rank) * p.source_block);
      count[0] = p.send_count[dest];
      count[1] = 0;  // flags: payloads always travel on this backend
    }
    __threadfence_system();
    for (int dest = 0; dest < p.world_size; ++dest)
      signal_release(p.signals[dest] + size_t(p.rank) * 8, epoch);
  }
}

__global__ void route_rows(const AllToAllParams p) {
  const uint64_t epoch = *p.epoch;
  const int W = p.world_size, L = p.num_local_experts;
  __shared__ bool failed;
  if (threadIdx.x == 0) failed = false;
  __syncthreads();
  for (int source = threadIdx.x; source < W; source += blockDim.x)
    if (!wait_signal(p.signals[p.rank] + size_t(source) * 8, epoch, p.timeout_ns, p.error,
                     source, kKernelDispatchRecv))
      failed = true;
  __syncthreads();
  if (failed) {
    for (int e = threadIdx.x; e < L; e += blockDim.x) p.expert_num_tokens[e] = 0;
    if (threadIdx.x == 0) *p.route_count = 0;
    return;
  }
  const std::byte* region = p.regions[p.rank];
  auto header_of = [&](int source, int slot) {
    return reinterpret_cast<const int32_t*>(region + size_t(source) * p.source_block + 64 +
                                            size_t(slot) * p.token_stride);
  };
  auto count_of = [&](int source) {
    return *reinterpret_cast<const int32_t*>(region + size_t(source) * p.source_block);
  };
  // Rows per (source, local expert), then each expert's rows in (source, token) order.
  for (int i = threadIdx.x; i < W * L; i += blockDim.x) {
    const int source = i / L, expert = i % L;
    int rows = 0;
    for (int slot = 0; slot < count_of(source); ++slot) {
      const int32_t* h = header_of(source, slot);
      for (int q = 0; q < h[1]; ++q) rows += h[2 + 2 * q] == expert;
    }
    p.recv_count[i] = rows;
  }
  if (threadIdx.x == 0) *p.route_count = 0;
  __syncthreads();
  for (int expert = threadIdx.x; expert < L; expert += blockDim.x) {
    int total = 0;
    for (int source = 0; source < W; ++source) total += p.recv_count[source * L + expert];
    p.expert_num_tokens[expert] = total;
  }
  for (int i = threadIdx.x; i < W * L; i += blockDim.x) {
    const int source = i / L, expert = i % L;
    int position = 0;
    for (int s = 0; s < source; ++s) position += p.recv_count[s * L + expert];
    for (int slot = 0; slot < count_of(source); ++slot) {
      const int32_t* h = header_of(source, slot);
      for (int q = 0; q < h[1]; ++q) {
        if (h[2 + 2 * q] != expert) continue;
        const int route = atomicAdd(p.route_count, 1);
        p.routes[route] = Route{source, h[0], h[3 + 2 * q],
                                int32_t(expert * p.rows_per_expert + position++), slot, {}};
      }
    }
  }
}

__global__ void land_rows(const AllToAllParams p) {
  const int routes = *p.route_count;
  const std::byte* region = p.regions[p.rank];
  for (int r = blockIdx.x; r < routes; r += gridDim.x) {
    const Route route = p.routes[r];
    const std::byte* slot =
        region + size_t(route.source) * p.source_block + 64 + size_t(route.src_slot) * p.token_stride;
    block_copy(p.expert_x + size_t(route.row) * p.payload_bytes, slot + p.payload_offset_in_slot,
               p.payload_bytes);
    if (p.scale_bytes)
      block_copy(reinterpret_cast<std::byte*>(p.expert_x_scale) + size_t(route.row) * p.scale_bytes,
                 slot + p.scale_offset_in_slot, p.scale_bytes);
  }
}

}  // namespace

void launch_dispatch_send(const AllToAllParams& p, cudaStream_t stream, int blocks) {
  launch(route_tokens, 1, kBlockThreads, stream, p);
  launch(send_tokens, blocks, kBlockThreads, stream, p);
}

void launch_dispatch_recv(const AllToAllParams& p, cudaStream_t stream, int blocks) {
  launch(route_rows, 1, kBlockThreads, stream, p);
  launch(land_rows, blocks, kBlockThreads, stream, p);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
