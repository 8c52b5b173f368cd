// AllToAll combine on the CUDA backend. Layout: src/all_to_all/layout.hpp (every offset below
// comes from it), scratch: params.cuh.
//
//   send:  return_rows (grid)  in place (expert_y is this rank's expert output buffer): a row
//                              ref (the row's index there) to each direct source's row-ref slot
//                              at (token, top-k slot), a thread per route; otherwise each routed
//                              row of expert_y to its source's combine area there, 16-byte words
//                              with several loads in flight; ranks start at different routes
//                              (rank / W of the way in), so they do not all write to one source
//                              first; a remote source's row is staged here and put by the
//                              block's thread 0, which flushes its own puts before the block
//                              ends (a flush covers the calling thread's only); the last block
//                              writes this rank's expert_y dtype there and signals every source
//   recv:  await_owners (1 block)  waits for every owner (a thread each) and checks its dtype
//                                  (for Phase::both, the last block of return_rows does this
//                                  instead, when every other block has ended: one kernel less)
//          reduce_rows (grid)      launched dependent on await_owners (it may become resident
//                                  once the waits are over); y[t] = sum_j w[t, j] * row(t, j) in
//                                  f32, in j order, multiply and add rounded separately (no
//                                  FMA), as the CPU backend does: the two give the same bits.
//                                  Each row is read where it lies: in its owner's expert output
//                                  buffer (a row ref) or in this rank's combine area
// Node-summed combine (combine_sums_in_node) changes where rows go and how y is summed:
// node_sum.cuh draws it.
// Only one block of each rank ever spins, and none waits for a block of its own grid. Ranks
// sharing a GPU must not fill its SMs with waiting blocks: a peer's kernel that would let them go
// on could then never be scheduled. The slowest block of each (docs/gpu-all-to-all.md, "Critical
// path"): return_rows, its share of the routes (a row copy or a row ref each) and, the last one,
// 2 barrier rounds, W dtype words and W signals (5 rounds with the fused wait); await_owners, a
// wait per owner, 2 rounds; reduce_rows, one token: its rows looked up once (one barrier), then
// k rows summed.
#include "cuda/all_to_all/node_sum.cuh"  // first: see params.cuh
#include "cuda/transport/transport.cuh"
#include "cuda/all_to_all/kernels.hpp"
#include "cuda/check.hpp"
#include "pmoe/dtype.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

// combine(recv)'s one waiting block (await_owners, or the last block of return_rows): the step
// and m checks, then waits for every owner and checks its dtype. A collective of the block.
__device__ void wait_owners(const AllToAllParams& p) {
  const uint64_t epoch = *p.epoch;
  const AllToAllLayout& lay = p.layout;
  __shared__ bool failed;
  if (threadIdx.x == 0) {
    failed = failed_before(p) || !step_in_order(p, Step::combine_recv);
    // Graph replays may change bound_m between the two: combine reads only the rows dispatch
    // sent (reduce_rows takes the smaller m) and says so.
    const int m = tokens_this_call(p);
    if (!failed && m != p.round->dispatched_m)
      report(p.error, kTokensMismatch, m, Step::combine_recv, p.round->dispatched_m);
    p.round->next_step = int32_t(Step::dispatch_send);
  }
  __syncthreads();
  if (lay.node_sum && !failed) sum_for_relayed_sources(p, epoch, failed);
  // Node sum: of the ranks on another node, only this rank's relay there sends (the node's
  // partials, with its dtype at their head).
  const int R = lay.ranks_per_node;
  auto sends_here = [&](int owner) {
    return !lay.node_sum || owner / R == p.rank / R || owner == lay.peer_on_node(p.rank, owner / R);
  };
  for (int owner = threadIdx.x; owner < p.world_size && !failed; owner += blockDim.x) {
    if (!sends_here(owner) || !is_live(p, owner)) continue;
    if (!wait_signal(p.transport, lay.combine_signal(owner), epoch, p.timeout_ns, p.error, owner,
                     Step::combine_recv)) {
      failed = true;
    } else {
      const size_t dtype_at = lay.node_sum && owner / R != p.rank / R
                                  ? lay.partial_in(owner / R)
                                  : lay.combine_dtype_slot(owner);
      const int32_t dtype =
          *reinterpret_cast<const volatile int32_t*>(p.regions[p.rank] + dtype_at);
      if (dtype != p.y_dtype) {
        report(p.error, kDtypeMismatch, owner, Step::combine_recv, dtype);
        failed = true;
      }
    }
  }
  __syncthreads();
  allow_dependent_grid();  // reduce_rows may start launching: no block of this one waits any more
  if (threadIdx.x == 0) *p.owners_ready = failed ? 0 : 1;
}

__global__ void __launch_bounds__(kBlockThreads) return_rows(const AllToAllParams p) {
  if (failed_before(p)) return;
  if (p.round->next_step != int32_t(Step::combine_send)) {  // every block sees the same
    if (blockIdx.x == 0 && threadIdx.x == 0) step_in_order(p, Step::combine_send);
    return;
  }
  const int routes = *p.route_count;
  const AllToAllLayout& lay = p.layout;
  const size_t row_bytes = size_t(p.hidden_dim) * p.y_elem_bytes;
  const int start = int(int64_t(routes) * p.rank / p.world_size);
  // In place: a direct source reads each row where it lies in this rank's expert output buffer,
  // so a row ref (4 bytes, a thread per route) crosses instead of the row; -1 says the row is in
  // the source's combine area.
  if (p.row_refs) {
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < routes; r += gridDim.x * blockDim.x) {
      count_serial_steps(1);
      const Route route = p.routes[r];
      if (std::byte* source = p.regions[route.source])
        store_to_peer(reinterpret_cast<int32_t*>(source +
                                                 lay.row_ref_slot(route.token, route.slot)),
                      p.y_in_place ? route.row : -1);
    }
  }
  for (int r = blockIdx.x; r < routes; r += gridDim.x) {
    const int index = (start + r) % routes;
    const Route route = p.routes[index];
    // A remote source: the row is staged in this rank's region and put from there (window to
    // window) once the whole block has written it; with node sums, it goes to the source's relay
    // on this node instead, by load/store. The same for every thread of the block.
    const bool staged = p.regions[route.source] == nullptr && !lay.node_sum;
    const size_t at = lay.combine_row_offset(route.token, route.slot);
    if (p.y_in_place && p.regions[route.source]) continue;  // its row ref went above
    std::byte* to = p.regions[route.source] ? p.regions[route.source] + at
                    : staged ? p.regions[p.rank] + lay.combine_stage(index)
                             : relay_row_for(p, route);
    copy_to_each(
        1, [](int) { return true; }, [&](int) { return to; },
        p.expert_y + size_t(route.row) * row_bytes, row_bytes);
    if (staged) {
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence_system();  // the block's stores to the staging, before the put reads them
        if (!put(p.transport, route.source, at, lay.combine_stage(index), row_bytes))
          report(p.error, kNoRemote, route.source, Step::combine_send);
      }
    }
  }
  // A flush covers only the calling thread's puts (gin.h: "from any thread in this coop", and the
  // coop is the thread): each block's thread 0 flushes the rows it put itself, so that when this
  // kernel ends every staged row has been read and the next combine may rewrite the staging.
  if (threadIdx.x == 0) flush(p.transport);
  if (!last_block_all(&p.block_counters[kReturnDone], p.transport.same_device)) return;
  if (lay.node_sum) {
    stage_weights(p);
    __syncthreads();  // every thread's weights, before thread 0 puts them
  }
  if (threadIdx.x == 0) {
    if (lay.node_sum) put_weights(p);
    p.round->next_step = int32_t(Step::combine_recv);  // every block has read it
    const uint64_t epoch = *p.epoch;
    for (int dest = 0; dest < p.world_size; ++dest)
      if (p.regions[dest] && is_live(p, dest))
        store_to_peer(reinterpret_cast<int32_t*>(p.regions[dest] + lay.combine_dtype_slot(p.rank)),
                      int32_t(p.y_dtype));
    // Remote sources get it from the staging, with the signal: after this rank's rows to them.
    if (lay.stage_dtype_offset)
      store_to_peer(reinterpret_cast<int32_t*>(p.regions[p.rank] + lay.stage_dtype_offset),
                    int32_t(p.y_dtype));
    fence_for_peers(p.transport.same_device);
    for (int dest = 0; dest < p.world_size; ++dest) {
      if (!is_live(p, dest)) continue;
      if (p.signals[dest]) {
        signal_release(p.signals[dest] + lay.signal_word(lay.combine_signal(p.rank)), epoch,
                       p.transport.same_device);
      } else if (lay.node_sum) {
        continue;  // its rows went to its relay on this node, which signals it
      } else if (!put_signal(p.transport, dest, lay.combine_dtype_slot(p.rank),
                             lay.stage_dtype_offset, sizeof(int32_t),
                             lay.combine_signal(p.rank))) {
        report(p.error, kNoRemote, dest, Step::combine_send);
      }
    }
    flush(p.transport);  // the dtype's staging word (or the weights), put above by this thread
  }
  if (p.fuse_recv) {
    __syncthreads();  // next_step, advanced above
    wait_owners(p);
  }
}

__global__ void __launch_bounds__(kBlockThreads) await_owners(const AllToAllParams p) {
  wait_owners(p);
}

// The rows one token sums, found once per token by every thread alike, for top-k up to kListedK:
// slot j's row and weight, or not sent. Indexed by j only in unrolled loops, so the list stays in
// registers. A row is read where it lies: in place in its owner's expert output buffer (a row
// ref), or in this rank's combine area.
constexpr int kListedK = 8, kInFlight = 4;
template <typename In>
struct TokenRows {
  const In* row[kListedK];
  float weight[kListedK];
  bool sent[kListedK];
  bool aligned;  // every sent row starts on a 16-byte boundary
  int count;     // rows sent
};

// Row (t, j) of a direct source: where its owner's row ref says, or the combine area.
template <typename In>
__device__ __forceinline__ const In* row_of(const AllToAllParams& p, int t, int j) {
  const AllToAllLayout& lay = p.layout;
  const std::byte* region = p.regions[p.rank];
  if (p.row_refs) {
    const int owner = p.indices[size_t(t) * p.top_k + j] / p.num_local_experts;
    if (const std::byte* at = p.regions[owner]) {  // a remote owner copied the row
      const int32_t ref = load_global(reinterpret_cast<const int32_t*>(
          region + lay.row_ref_slot(t, j)));
      if (ref >= 0)
        return reinterpret_cast<const In*>(at + lay.expert_output_offset +
                                           size_t(ref) * p.hidden_dim * sizeof(In));
    }
  }
  return reinterpret_cast<const In*>(region + lay.combine_row_offset(t, j));
}

// Token t's rows, looked up once for the block: thread j < k finds slot j's row and weight and
// posts them in `posted` (one of two, by the parity of the block's token count, so that the next
// token's posts cannot overwrite what a slower thread still reads); after one barrier every
// thread takes the list into registers. A collective of the block.
template <typename In>
struct PostedRows {
  const In* row[kListedK];
  float weight[kListedK];
  bool sent[kListedK];
};
template <typename In>
__device__ __forceinline__ TokenRows<In> token_rows(const AllToAllParams& p, int t,
                                                   PostedRows<In>& posted) {
  const int k = p.top_k, E = p.num_local_experts * p.world_size;
  const int32_t* indices = p.indices + size_t(t) * k;
  if (const int j = threadIdx.x; j < kListedK) {
    // The slots dispatch sent: -1, an index out of range and a repeated expert were skipped
    // there (and reported), so no row came back for them.
    const bool sent = j < k && first_in_group(indices, j, E, 1);
    posted.sent[j] = sent;
    posted.row[j] = sent ? row_of<In>(p, t, j) : nullptr;
    posted.weight[j] = sent ? load_global(p.weights + size_t(t) * k + j) : 0.0f;
  }
  __syncthreads();
  TokenRows<In> rows;
  rows.aligned = true;
  rows.count = 0;
  PMOE_UNROLL
  for (int j = 0; j < kListedK; ++j) {
    rows.sent[j] = posted.sent[j];
    rows.row[j] = posted.row[j];
    rows.weight[j] = posted.weight[j];
    rows.aligned = rows.aligned && reinterpret_cast<uintptr_t>(rows.row[j]) % 16 == 0;
    rows.count += rows.sent[j];
  }
  return rows;
}

// y[t] from the listed rows: per step, kInFlight rows' V elements loaded before any of them is
// added, so that many loads are in flight at once; the adds run in j order.
template <typename In, typename Out>
__device__ __forceinline__ void sum_listed_rows(const TokenRows<In>& rows, Out* y, int H) {
  constexpr int V = 16 / (sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out));
  using InPack = Pack<In, V>;
  using OutPack = Pack<Out, V>;
  const bool aligned = rows.aligned && H % V == 0 &&
                       reinterpret_cast<uintptr_t>(y) % sizeof(OutPack) == 0;
  const int vector_end = aligned ? H : 0;
  for (int h = threadIdx.x * V; h < vector_end; h += blockDim.x * V) {
    count_serial_steps(rows.count);
    float acc[V] = {};
    // kInFlight rows' loads at a time: all of 8 would not fit in the registers beside the rest.
    PMOE_UNROLL
    for (int first = 0; first < kListedK; first += kInFlight) {
      InPack in[kInFlight];
      PMOE_UNROLL
      for (int i = 0; i < kInFlight; ++i)
        if (rows.sent[first + i])
          in[i] = load_global(reinterpret_cast<const InPack*>(rows.row[first + i] + h));
      PMOE_UNROLL
      for (int i = 0; i < kInFlight; ++i)
        if (rows.sent[first + i])
          PMOE_UNROLL
          for (int v = 0; v < V; ++v)
            acc[v] = __fadd_rn(acc[v], __fmul_rn(rows.weight[first + i], load(in[i].v, v)));
    }
    OutPack out;
    for (int v = 0; v < V; ++v) store(out.v, v, acc[v]);
    store_global(reinterpret_cast<OutPack*>(y + h), out);
  }
  for (int h = vector_end + threadIdx.x; h < H; h += blockDim.x) {
    count_serial_steps(rows.count);
    float acc[1] = {0.0f};
    PMOE_UNROLL
    for (int j = 0; j < kListedK; ++j)
      if (rows.sent[j]) add_scaled<1>(acc, rows.row[j], h, rows.weight[j]);
    Out out;
    store(&out, 0, acc[0]);
    store_global(y + h, out);
  }
}

// y[t] = sum_j w[t, j] * row(t, j) in f32, j ascending, for every slot dispatch sent; node sum:
// each node's partial in node order, this rank's own node's rows summed here in j order. The
// plain loop: any number of rows, the weights and rows found again for every 16-byte word (or
// element, where the rows are not aligned to words).
template <typename In, typename Out>
__device__ __forceinline__ void sum_rows_plainly(const AllToAllParams& p, int t, Out* y) {
  constexpr int V = 16 / (sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out));
  const int k = p.top_k, H = p.hidden_dim;
  const int E = p.num_local_experts * p.world_size;
  const AllToAllLayout& lay = p.layout;
  const std::byte* region = p.regions[p.rank];
  const int N = lay.nodes, my_node = lay.node_sum ? p.rank / lay.ranks_per_node : 0;
  const size_t row_bytes = size_t(H) * sizeof(In);
  const int32_t* indices = p.indices + size_t(t) * k;
  const float* weights = p.weights + size_t(t) * k;
  auto sent = [&](int j) { return first_in_group(indices, j, E, 1); };
  // acc[c] = y[t, h + c] before rounding.
  auto accumulate = [&](auto& acc, int h) {
    constexpr int C = sizeof(acc) / sizeof(float);
    count_serial_steps(k);
    if (!lay.node_sum) {
      for (int j = 0; j < k; ++j)
        if (sent(j)) add_scaled<C>(acc, row_of<In>(p, t, j), h, weights[j]);
      return;
    }
    for (int n = 0; n < N; ++n) {
      if (n == my_node) {
        float own[C] = {};
        for (int j = 0; j < k; ++j)
          if (sent(j) && node_of_expert(lay, indices[j]) == my_node)
            add_scaled<C>(own, row_of<In>(p, t, j), h, weights[j]);
        for (int c = 0; c < C; ++c) acc[c] = __fadd_rn(acc[c], own[c]);
      } else if (const int q = p.relay_slot[t * N + n]; q >= 0) {
        const auto* partial = reinterpret_cast<const In*>(
            region + AllToAllLayout::partial_row(lay.partial_in(n), q, row_bytes));
        add_scaled<C>(acc, partial, h, 1.0f);  // exact: w = 1
      }
    }
  };
  // Words where every row can be: the combine area's rows, in-place rows (row_bytes apart from
  // a 64-byte boundary) and partial rows (16-byte strides) all start on 16 bytes, and y's row.
  const bool aligned =
      H % V == 0 && row_bytes % 16 == 0 &&
      (reinterpret_cast<uintptr_t>(region + lay.combine_offset) | lay.combine_row) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(y) % (V * sizeof(Out)) == 0;
  const int vector_end = aligned ? H : 0;
  for (int h = threadIdx.x * V; h < vector_end; h += blockDim.x * V) {
    float acc[V] = {};
    accumulate(acc, h);
    Pack<Out, V> out;
    for (int v = 0; v < V; ++v) store(out.v, v, acc[v]);
    store_global(reinterpret_cast<Pack<Out, V>*>(y + h), out);
  }
  for (int h = vector_end + threadIdx.x; h < H; h += blockDim.x) {
    float acc[1] = {0.0f};
    accumulate(acc, h);
    Out out;
    store(&out, 0, acc[0]);
    store_global(y + h, out);
  }
}

template <typename In, typename Out>
__global__ void __launch_bounds__(kBlockThreads) reduce_rows(const AllToAllParams p) {
  wait_for_prior_grid();
  // The waiting block gave up, or (a step out of order) never ran: the error word says why.
  if (failed_before(p) || *p.owners_ready == 0) return;
  const int tokens = min(tokens_this_call(p), p.round->dispatched_m), H = p.hidden_dim;
  __shared__ PostedRows<In> posted[2];
  int turn = 0;
  for (int t = blockIdx.x; t < tokens; t += gridDim.x, turn ^= 1) {
    Out* y = reinterpret_cast<Out*>(p.y) + size_t(t) * H;
    if (p.layout.node_sum || p.top_k > kListedK)
      sum_rows_plainly<In, Out>(p, t, y);
    else
      sum_listed_rows<In, Out>(token_rows<In>(p, t, posted[turn]), y, H);
  }
}

template <typename In>
void launch_reduce(const AllToAllParams& p, cudaStream_t stream, int blocks) {
  constexpr const char* kName = "reduce_rows";
  switch (DType(p.out_dtype)) {
    case DType::f32: launch_dependent(kName, reduce_rows<In, float>, blocks, stream, p); break;
    case DType::bf16:
      launch_dependent(kName, reduce_rows<In, __nv_bfloat16>, blocks, stream, p);
      break;
    case DType::f16: launch_dependent(kName, reduce_rows<In, __half>, blocks, stream, p); break;
    default: throw Error("combine: y must be f32, bf16 or f16");
  }
}

}  // namespace

void launch_combine_send(const AllToAllParams& p, cudaStream_t stream, int blocks) {
  launch("return_rows", return_rows, blocks, stream, p);
}

void launch_combine_recv(const AllToAllParams& p, cudaStream_t stream, int blocks, bool waited) {
  if (!waited) launch("await_owners", await_owners, 1, stream, p);
  blocks = std::max(1, std::min(blocks, p.m));  // reduce_rows takes a token a block
  switch (DType(p.y_dtype)) {
    case DType::f32: launch_reduce<float>(p, stream, blocks); break;
    case DType::bf16: launch_reduce<__nv_bfloat16>(p, stream, blocks); break;
    case DType::f16: launch_reduce<__half>(p, stream, blocks); break;
    default: throw Error("combine: expert_y must be f32, bf16 or f16");
  }
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
