// The MoE layers' small kernels (moe_kernels.cuh). Element-wise ones run one thread an element,
// grid-stride; the router and the grouping one thread a token or an expert.
//
//   router:   logits [m, E] f32 --top_k_softmax--> indices [m, k] i32, weights [m, k] f32
//   grouping: indices --group_pairs--> counts [E], token_of_row [E, C], row_of_pair [m, k]
//             x [m, H] T --gather_rows--> gathered [E, C, H] T   (rows i < counts[e] only)
//   experts:  counts --plan_tiles--> each GEMM operand's tile addresses (device_experts.hpp)
//             hidden [E, C, g F'] f32 --activate--> act [E, C, F'] T (f32: in place in hidden)
//   gating:   out [E, C, O] f32, row_of_pair, weights --weighted_sum--> y [m, O] dtype
//
// T is the layer's dtype (f32 or bf16), the expert GEMMs' input type. C is a capacity (the
// call's m for the local layers, W * tokens per micro-batch for EP): these kernels skip the rows
// past an expert's count.
#include "cuda/moe/moe_kernels.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cuda/atomic>

#include "cuda/check.hpp"
#include "cuda/launch.cuh"
#include "cuda/memory_ops.cuh"
#include "moe/ep_traffic.hpp"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

constexpr int kMaxBlocks = 64;  // element-wise kernels: enough blocks to fill a device

int blocks_for(int64_t elements) {
  return int(std::max<int64_t>(
      1, std::min<int64_t>(kMaxBlocks, (elements + kBlockThreads - 1) / kBlockThreads)));
}

__device__ __forceinline__ int64_t first_index() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_step() { return int64_t(gridDim.x) * blockDim.x; }

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T narrow(float v);
template <>
__device__ __forceinline__ float narrow<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ bool row_in_use(const int32_t* limits, int64_t group_rows, int64_t r) {
  return limits == nullptr || r % group_rows < limits[r / group_rows];
}

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) widen_rows_kernel(const WidenRows w) {
  const T* src = static_cast<const T*>(w.src);
  for (int64_t e = first_index(); e < w.rows * w.cols; e += grid_step()) {
    const int64_t r = e / w.cols, c = e % w.cols;
    if (!row_in_use(w.row_limits, w.group_rows, r)) continue;
    store_to_peer(w.dst + r * w.dst_ld + c, widen(src[r * w.src_ld + c]));
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) narrow_rows_kernel(const NarrowRows n) {
  T* dst = static_cast<T*>(n.dst);
  const int64_t width = n.pad_to > n.cols ? n.pad_to : n.cols;
  for (int64_t e = first_index(); e < n.rows * width; e += grid_step()) {
    const int64_t r = e / width, c = e % width;
    if (!row_in_use(n.row_limits, n.group_rows, r)) continue;
    store_to_peer(dst + r * n.dst_ld + c, narrow<T>(c < n.cols ? n.src[r * n.src_ld + c] : 0.0f));
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) copy_rows_kernel(const CopyRows c) {
  const T* src = static_cast<const T*>(c.src);
  T* dst = static_cast<T*>(c.dst);
  for (int64_t e = first_index(); e < c.rows * c.dst_cols; e += grid_step()) {
    const int64_t r = e / c.dst_cols, col = e % c.dst_cols;
    store_to_peer(dst + r * c.dst_ld + col, col < c.copy_cols ? src[r * c.src_ld + col] : T(0));
  }
}

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

__global__ void __launch_bounds__(kBlockThreads) group_pairs_kernel(const GroupPairs g) {
  const int pairs = g.m * g.top_k;
  for (int64_t e = first_index(); e < g.num_experts; e += grid_step()) {
    int32_t count = 0;
    for (int p = 0; p < pairs; ++p) {
      if (g.indices[p] != e) continue;
      const int32_t row = int32_t(e) * g.capacity + count++;
      store_to_peer(g.token_of_row + row, int32_t(p / g.top_k));
      store_to_peer(g.row_of_pair + p, row);
    }
    store_to_peer(g.counts + e, count);
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

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) gather_rows_kernel(const GatherRows g) {
  const T* x = static_cast<const T*>(g.x);
  T* gathered = static_cast<T*>(g.gathered);
  const int64_t rows = int64_t(g.num_experts) * g.capacity;
  for (int64_t e = first_index(); e < rows * g.H; e += grid_step()) {
    const int64_t row = e / g.H, c = e % g.H;
    if (row % g.capacity >= g.counts[row / g.capacity]) continue;
    store_to_peer(gathered + e, x[int64_t(g.token_of_row[row]) * g.H + c]);
  }
}

__device__ __forceinline__ float gelu(float v) {
  return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) activate_kernel(const Activate a) {
  const bool swiglu = a.act == int(Activation::swiglu);
  const int64_t ld = swiglu ? 2 * a.width : a.width;
  T* out = static_cast<T*>(a.out);
  for (int64_t e = first_index(); e < a.rows * a.width; e += grid_step()) {
    const int64_t r = e / a.width, c = e % a.width;
    if (!row_in_use(a.row_limits, a.group_rows, r)) continue;
    const float* h = a.hidden + r * ld;
    const float v = h[c];
    const float y = a.act == int(Activation::relu) ? (v > 0.0f ? v : 0.0f)
                    : swiglu                       ? silu(v) * h[a.width + c]
                                                   : gelu(v);
    store_to_peer(out + r * a.out_ld + c, narrow<T>(y));
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) weighted_sum_kernel(const WeightedSum w) {
  T* y = static_cast<T*>(w.y);
  for (int64_t e = first_index(); e < int64_t(w.m) * w.O; e += grid_step()) {
    const int64_t t = e / w.O, o = e % w.O;
    float acc = 0.0f;
    for (int j = 0; j < w.top_k; ++j) {
      const int64_t p = t * w.top_k + j;
      acc += w.weights[p] * w.rows[int64_t(w.row_of_pair[p]) * w.O + o];
    }
    store_to_peer(y + e, narrow<T>(acc));
  }
}

__global__ void publish_count_kernel(uint64_t* word, int64_t n) { store_to_peer(word, uint64_t(n)); }

// Every thread reads the W counts (after the landed waits' acquire): all agree, so all sum or all
// skip; one thread records the mismatch.
template <typename T>
__global__ void __launch_bounds__(kBlockThreads) sum_partials_kernel(const SumPartials s) {
  for (int r = 0; r < s.world; ++r) {
    const int64_t theirs = int64_t(*s.counts[r]);
    if (theirs == s.n) continue;
    if (first_index() == 0) {
      using HostCount = ::cuda::atomic_ref<int64_t, ::cuda::thread_scope_system>;
      using HostWord = ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_system>;
      HostCount(s.mismatch->theirs).store(theirs, ::cuda::memory_order_relaxed);
      HostCount(s.mismatch->mine).store(s.n, ::cuda::memory_order_relaxed);
      HostWord(s.mismatch->peer).store(r, ::cuda::memory_order_release);
    }
    return;
  }
  T* out = static_cast<T*>(s.out);
  for (int64_t e = first_index(); e < s.n; e += grid_step()) {
    float sum = 0.0f;
    for (int r = 0; r < s.world; ++r) sum = __fadd_rn(sum, s.parts[r][e]);
    store_to_peer(out + e, narrow<T>(sum));
  }
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

// One kernel template per element type, f32 or bf16.
template <template <typename> class Kernel, typename Args>
void launch_typed(const char* what, DType dtype, int blocks, cudaStream_t stream, const Args& a) {
  switch (dtype) {
    case DType::f32:
      launch(Kernel<float>::fn, blocks, stream, a);
      return;
    case DType::bf16:
      launch(Kernel<__nv_bfloat16>::fn, blocks, stream, a);
      return;
    default:
      throw Error(detail::cat(what, ": no kernel for ", dtype_name(dtype)));
  }
}

template <typename T>
struct Widen {
  static constexpr auto fn = widen_rows_kernel<T>;
};
template <typename T>
struct Narrow {
  static constexpr auto fn = narrow_rows_kernel<T>;
};
template <typename T>
struct Weighted {
  static constexpr auto fn = weighted_sum_kernel<T>;
};
template <typename T>
struct Act {
  static constexpr auto fn = activate_kernel<T>;
};
template <typename T>
struct SumParts {
  static constexpr auto fn = sum_partials_kernel<T>;
};

}  // namespace

void launch_widen_rows(const WidenRows& w, DType dtype, cudaStream_t stream) {
  if (w.rows * w.cols == 0) return;
  launch_typed<Widen>("MoE widen_rows", dtype, blocks_for(w.rows * w.cols), stream, w);
}

const float* rows_as_f32(const void* x, DType dtype, int64_t m, int64_t H, float* scratch,
                         cudaStream_t stream) {
  if (dtype == DType::f32 || m == 0) return static_cast<const float*>(x);
  WidenRows w;
  w.src = x;
  w.src_ld = H;
  w.dst = scratch;
  w.dst_ld = H;
  w.rows = m;
  w.cols = H;
  launch_widen_rows(w, dtype, stream);
  return scratch;
}

void launch_narrow_rows(const NarrowRows& n, DType dtype, cudaStream_t stream) {
  const int64_t elements = n.rows * std::max(n.cols, n.pad_to);
  if (elements == 0) return;
  launch_typed<Narrow>("MoE narrow_rows", dtype, blocks_for(elements), stream, n);
}

void launch_copy_rows(const CopyRows& c, int elem, cudaStream_t stream) {
  const int64_t elements = c.rows * c.dst_cols;
  if (elements == 0) return;
  switch (elem) {
    case 4:
      launch(copy_rows_kernel<uint32_t>, blocks_for(elements), stream, c);
      return;
    case 2:
      launch(copy_rows_kernel<uint16_t>, blocks_for(elements), stream, c);
      return;
    default:
      throw Error(detail::cat("MoE copy_rows: no kernel for ", elem, "-byte elements"));
  }
}

void launch_top_k_softmax(const TopKSoftmax& t, cudaStream_t stream) {
  if (t.m == 0) return;
  launch(top_k_softmax_kernel, blocks_for(t.m), stream, t);
}

void launch_group_pairs(const GroupPairs& g, cudaStream_t stream) {
  launch(group_pairs_kernel, blocks_for(g.num_experts), stream, g);
}

void launch_plan_tiles(const PlanTiles& p, cudaStream_t stream) {
  if (p.max_tiles == 0) return;
  launch(plan_tiles_kernel, 1, stream, p);
}

void launch_gather_rows(const GatherRows& g, int elem, cudaStream_t stream) {
  const int64_t elements = int64_t(g.num_experts) * g.capacity * g.H;
  if (elements == 0) return;
  switch (elem) {
    case 4:
      launch(gather_rows_kernel<uint32_t>, blocks_for(elements), stream, g);
      return;
    case 2:
      launch(gather_rows_kernel<uint16_t>, blocks_for(elements), stream, g);
      return;
    default:
      throw Error(detail::cat("MoE gather_rows: no kernel for ", elem, "-byte elements"));
  }
}

void launch_activate(const Activate& a, DType dtype, cudaStream_t stream) {
  if (a.rows * a.width == 0) return;
  launch_typed<Act>("MoE activate", dtype, blocks_for(a.rows * a.width), stream, a);
}

void launch_weighted_sum(const WeightedSum& w, DType dtype, cudaStream_t stream) {
  if (int64_t(w.m) * w.O == 0) return;
  launch_typed<Weighted>("MoE weighted_sum", dtype, blocks_for(int64_t(w.m) * w.O), stream, w);
}

void launch_count_ep_rows(const CountEpRows& c, cudaStream_t stream) {
  launch(count_ep_rows_kernel, 1, stream, c);
}

void launch_publish_count(uint64_t* word, int64_t n, cudaStream_t stream) {
  launch_shaped(publish_count_kernel, dim3(1), dim3(1), stream, word, n);
}

void launch_sum_partials(const SumPartials& s, DType dtype, cudaStream_t stream) {
  launch_typed<SumParts>("TpMoe all-reduce", dtype, blocks_for(s.n), stream, s);
}

CountMismatchRecord::CountMismatchRecord() {
  PMOE_CUDA_CHECK(cudaHostAlloc(&host_, sizeof(CountMismatch), cudaHostAllocMapped));
  *host_ = CountMismatch();
  PMOE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0));
}

CountMismatchRecord::~CountMismatchRecord() { (void)cudaFreeHost(host_); }

std::optional<CountMismatch> CountMismatchRecord::take() {
  // cuda::atomic_ref: loads the emulated device judges (src/cuda/emulator/host_view.hpp).
  using Count = ::cuda::atomic_ref<int64_t, ::cuda::thread_scope_system>;
  using Word = ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_system>;
  const int32_t peer = Word(host_->peer).load(::cuda::memory_order_acquire);
  if (peer < 0) return std::nullopt;
  CountMismatch seen;
  seen.theirs = Count(host_->theirs).load(::cuda::memory_order_relaxed);
  seen.mine = Count(host_->mine).load(::cuda::memory_order_relaxed);
  seen.peer = peer;
  Word(host_->peer).store(-1, ::cuda::memory_order_relaxed);
  return seen;
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
