// The MoE layers' row kernels (moe_kernels.cuh): the kernels that move rows of data between the
// layers' GEMMs, where moe_routing_kernels.cu computes only indices.
//
//   grouping: x [m, H] T --gather_rows--> gathered [E, C, H] T   (rows i < counts[e] only)
//   experts:  hidden [E, C, g F'] f32 --activate--> act [E, C, F'] T (f32: in place in hidden)
//   gating:   out [E, C, O] f32, row_of_pair, weights --weighted_sum--> y [m, O] dtype
//
// and widen_rows, narrow_rows and copy_rows, which change rows' element type or width.
//
// T is the layer's dtype (f32 or bf16), the expert GEMMs' input type. C is a capacity (the
// call's m for the local layers, W * tokens per micro-batch for EP), and most of it is unused:
// m k rows in use of E m for the local layers. So the row kernels (widen, narrow, gather,
// activate) walk the rows in use only (for_each_live_row): each block scans the groups' counts
// (one word a group, 256 groups at a time, a block scan in shared memory), and the grid's
// warp-sized teams take the live rows in turn, team t the rows t, t + teams, ...; a team's
// threads step through the row in 16-byte words where the pointers and widths allow (8
// elements a step), one element otherwise. No division per element: the row comes from a
// binary search over the block's scan, the columns from the lane. They run on a full grid
// (grid_blocks: two blocks an SM), however few rows are live.
//
// Every load and store of row data, and the counts these kernels read, go through
// load_global / store_global (memory_ops.cuh), so the emulated device counts the bytes each
// kernel moves; the index words of a row (token_of_row) are plain loads.
#include "cuda/moe/moe_kernels.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>

#include "cuda/launch.cuh"
#include "cuda/memory_ops.cuh"
#include "cuda/moe/moe_kernel_helpers.cuh"
#include "pmoe/error.hpp"
#include "pmoe/moe.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

// Elements a step of a row kernel's thread: 8 (16-byte words: one of bf16, two of f32) where
// every row the kernel touches starts 16-byte aligned and its widths are multiples of 8, else 1.
constexpr int kWide = 8;
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool aligned16(int64_t bytes) { return bytes % 16 == 0; }

// v[0, K) = p[0, K) widened to f32: K = 8 in 16-byte words (p 16-byte aligned), K = 1 in one.
template <typename T, int K>
__device__ __forceinline__ void load_chunk(const T* p, float (&v)[K]) {
  if constexpr (K == 1) {
    v[0] = widen(load_global(p));
  } else {
    static_assert(K * sizeof(T) % sizeof(int4) == 0, "a chunk is whole 16-byte words");
    constexpr int kWords = int(K * sizeof(T) / sizeof(int4));
    int4 words[kWords];
    PMOE_UNROLL
    for (int w = 0; w < kWords; ++w) words[w] = load_global(reinterpret_cast<const int4*>(p) + w);
    T t[K];
    memcpy(t, words, sizeof t);
    PMOE_UNROLL
    for (int i = 0; i < K; ++i) v[i] = widen(t[i]);
  }
}
// p[0, K) = v[0, K) rounded to T, as load_chunk reads.
template <typename T, int K>
__device__ __forceinline__ void store_chunk(T* p, const float (&v)[K]) {
  if constexpr (K == 1) {
    store_global(p, narrow<T>(v[0]));
  } else {
    constexpr int kWords = int(K * sizeof(T) / sizeof(int4));
    T t[K];
    PMOE_UNROLL
    for (int i = 0; i < K; ++i) t[i] = narrow<T>(v[i]);
    int4 words[kWords];
    memcpy(words, t, sizeof t);
    PMOE_UNROLL
    for (int w = 0; w < kWords; ++w) store_global(reinterpret_cast<int4*>(p) + w, words[w]);
  }
}

// The rows in use of `groups` groups of `group_rows` rows: group g's first min(counts[g],
// group_rows) (every row where counts is null).
struct LiveRows {
  const int32_t* counts = nullptr;
  int groups = 0;
  int64_t group_rows = 0;
};
LiveRows live_rows(int64_t rows, const int32_t* limits, int64_t group_rows) {
  if (limits == nullptr) return {nullptr, 1, rows};
  PMOE_CHECK(group_rows > 0 && rows % group_rows == 0, "MoE row kernel: ", rows,
             " rows are not whole groups of ", group_rows);
  return {limits, int(rows / group_rows), group_rows};
}

constexpr int kTeam = 32;  // threads that walk one row together: a warp
constexpr int kTeamsPerBlock = kBlockThreads / kTeam;

// body(row, lane) for every live row (row = g group_rows + i), by the kTeam threads of one team
// (lane 0..31). The block scans the counts 256 groups at a time; team t of the grid takes the
// chunk's live rows t, t + teams, ... (numbered across chunks, so the grid stays balanced), each
// found by a binary search over the scan. Every thread of every block calls it; body must not
// synchronise.
template <typename Body>
__device__ __forceinline__ void for_each_live_row(const LiveRows& live, Body body) {
  __shared__ int64_t ends[kBlockThreads];  // the chunk's groups' live rows, inclusive scan
  const int lane = int(threadIdx.x) % kTeam;
  const int64_t teams = int64_t(gridDim.x) * kTeamsPerBlock;
  int64_t j = int64_t(blockIdx.x) * kTeamsPerBlock + int(threadIdx.x) / kTeam;  // next live row
  int64_t before = 0;  // live rows of the chunks before this one
  for (int first = 0; first < live.groups; first += kBlockThreads) {
    const int g = first + int(threadIdx.x);
    int64_t rows = 0;
    if (g < live.groups) {
      rows = live.group_rows;
      if (live.counts != nullptr) {
        const int64_t count = load_global(live.counts + g);
        if (count < rows) rows = count;
      }
    }
    block_inclusive_scan(ends, rows);
    const int in_chunk = min(live.groups - first, kBlockThreads);
    const int64_t chunk_end = before + ends[in_chunk - 1];
    for (; j < chunk_end; j += teams) {
      const int64_t local = j - before;
      int lo = 0, hi = in_chunk - 1;  // the first group whose scan passes `local`
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (ends[mid] > local)
          hi = mid;
        else
          lo = mid + 1;
      }
      const int64_t i = local - (lo > 0 ? ends[lo - 1] : 0);
      body(int64_t(first + lo) * live.group_rows + i, lane);
    }
    before = chunk_end;
    __syncthreads();  // every team is done with `ends` before the next chunk's scan
  }
}

template <typename T, int K>
__global__ void __launch_bounds__(kBlockThreads, kBlocksPerSm) widen_rows_kernel(const WidenRows w,
                                                                  const LiveRows live) {
  const T* src = static_cast<const T*>(w.src);
  for_each_live_row(live, [=](int64_t r, int lane) {
    for (int64_t c = int64_t(lane) * K; c < w.cols; c += kTeam * K) {
      float v[K];
      load_chunk<T, K>(src + r * w.src_ld + c, v);
      store_chunk<float, K>(w.dst + r * w.dst_ld + c, v);
    }
  });
}

template <typename T, int K>
__global__ void __launch_bounds__(kBlockThreads, kBlocksPerSm) narrow_rows_kernel(const NarrowRows n,
                                                                   const LiveRows live) {
  T* dst = static_cast<T*>(n.dst);
  const int64_t width = n.pad_to > n.cols ? n.pad_to : n.cols;
  for_each_live_row(live, [=](int64_t r, int lane) {
    for (int64_t c = int64_t(lane) * K; c < width; c += kTeam * K) {
      float v[K] = {};
      if (c < n.cols) load_chunk<float, K>(n.src + r * n.src_ld + c, v);  // K divides cols
      store_chunk<T, K>(dst + r * n.dst_ld + c, v);
    }
  });
}

// W: a 16-byte word where every width, stride and pointer allows, else the element; the sizes
// in W's.
template <typename W>
__global__ void __launch_bounds__(kBlockThreads, kBlocksPerSm) copy_rows_kernel(const CopyRows c,
                                                                 const int64_t words_per_elem) {
  const W* src = static_cast<const W*>(c.src);
  W* dst = static_cast<W*>(c.dst);
  const int64_t copy = c.copy_cols / words_per_elem, width = c.dst_cols / words_per_elem;
  const int64_t src_ld = c.src_ld / words_per_elem, dst_ld = c.dst_ld / words_per_elem;
  for_each_live_row({nullptr, 1, c.rows}, [=](int64_t r, int lane) {
    for (int64_t w = lane; w < width; w += kTeam)
      store_global(dst + r * dst_ld + w, w < copy ? load_global(src + r * src_ld + w) : W{});
  });
}

// W: a 16-byte word where rows and pointers allow, else the element.
template <typename W>
__global__ void __launch_bounds__(kBlockThreads, kBlocksPerSm) gather_rows_kernel(const GatherRows g,
                                                                   const int64_t row_words) {
  const W* x = static_cast<const W*>(g.x);
  W* gathered = static_cast<W*>(g.gathered);
  for_each_live_row({g.counts, g.num_experts, g.capacity}, [=](int64_t row, int lane) {
    const W* from = x + int64_t(g.token_of_row[row]) * row_words;
    W* to = gathered + row * row_words;
    for (int64_t w = lane; w < row_words; w += kTeam) store_global(to + w, load_global(from + w));
  });
}

__device__ __forceinline__ float gelu(float v) {
  return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

template <typename T, int K>
__global__ void __launch_bounds__(kBlockThreads, kBlocksPerSm) activate_kernel(const Activate a,
                                                                const LiveRows live) {
  const bool swiglu = a.act == int(Activation::swiglu);
  const int64_t ld = swiglu ? 2 * a.width : a.width;
  T* out = static_cast<T*>(a.out);
  for_each_live_row(live, [=](int64_t r, int lane) {
    const float* h = a.hidden + r * ld;
    for (int64_t c = int64_t(lane) * K; c < a.width; c += kTeam * K) {
      float v[K], y[K];
      load_chunk<float, K>(h + c, v);  // read before this thread writes them (f32 in place)
      if (swiglu) {
        float linear[K];
        load_chunk<float, K>(h + a.width + c, linear);
        PMOE_UNROLL
        for (int i = 0; i < K; ++i) y[i] = silu(v[i]) * linear[i];
      } else {
        PMOE_UNROLL
        for (int i = 0; i < K; ++i)
          y[i] = a.act == int(Activation::relu) ? (v[i] > 0.0f ? v[i] : 0.0f) : gelu(v[i]);
      }
      store_chunk<T, K>(out + r * a.out_ld + c, y);
    }
  });
}

// A team a token, as the row kernels (its k rows are the pairs' rows, wherever they are).
template <typename T, int K>
__global__ void __launch_bounds__(kBlockThreads, kBlocksPerSm) weighted_sum_kernel(const WeightedSum w) {
  T* y = static_cast<T*>(w.y);
  for_each_live_row({nullptr, 1, w.m}, [=](int64_t t, int lane) {
    for (int64_t o = int64_t(lane) * K; o < w.O; o += kTeam * K) {
      float acc[K] = {};
      for (int j = 0; j < w.top_k; ++j) {
        const int64_t p = t * w.top_k + j;
        const float weight = w.weights[p];
        float v[K];
        load_chunk<float, K>(w.rows + int64_t(w.row_of_pair[p]) * w.O + o, v);
        PMOE_UNROLL
        for (int i = 0; i < K; ++i) acc[i] += weight * v[i];
      }
      store_chunk<T, K>(y + t * w.O + o, acc);
    }
  });
}

// f(T{}) with T the element type of `dtype`, f32 or bf16 (the row kernels' second parameter,
// the chunk, is picked inside from the pointers).
template <typename F>
void for_dtype(const char* what, DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      f(float{});
      return;
    case DType::bf16:
      f(__nv_bfloat16{});
      return;
    default:
      throw Error(detail::cat(what, ": no kernel for ", dtype_name(dtype)));
  }
}

}  // namespace

void launch_widen_rows(const WidenRows& w, DType dtype, cudaStream_t stream) {
  if (w.rows * w.cols == 0) return;
  const LiveRows live = live_rows(w.rows, w.row_limits, w.group_rows);
  for_dtype("MoE widen_rows", dtype, [&](auto t) {
    using T = decltype(t);
    const int64_t elem = int64_t(sizeof(T));
    if (w.cols % kWide == 0 && aligned16(w.src) && aligned16(w.dst) &&
        aligned16(w.src_ld * elem) && aligned16(w.dst_ld * int64_t(sizeof(float))))
      launch("moe_widen_rows", widen_rows_kernel<T, kWide>, full_grid(), stream, w, live);
    else
      launch("moe_widen_rows", widen_rows_kernel<T, 1>, full_grid(), stream, w, live);
  });
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
  const int64_t width = std::max(n.cols, n.pad_to);
  if (n.rows * width == 0) return;
  const LiveRows live = live_rows(n.rows, n.row_limits, n.group_rows);
  for_dtype("MoE narrow_rows", dtype, [&](auto t) {
    using T = decltype(t);
    const int64_t elem = int64_t(sizeof(T));
    if (n.cols % kWide == 0 && width % kWide == 0 && aligned16(n.src) && aligned16(n.dst) &&
        aligned16(n.src_ld * int64_t(sizeof(float))) && aligned16(n.dst_ld * elem))
      launch("moe_narrow_rows", narrow_rows_kernel<T, kWide>, full_grid(), stream, n, live);
    else
      launch("moe_narrow_rows", narrow_rows_kernel<T, 1>, full_grid(), stream, n, live);
  });
}

void launch_copy_rows(const CopyRows& c, int elem, cudaStream_t stream) {
  if (c.rows * c.dst_cols == 0) return;
  // Elements a 16-byte word, where every width and stride is whole words.
  const int64_t per_word = int64_t(sizeof(int4)) / std::max(elem, 1);
  if (elem > 0 && c.copy_cols % per_word == 0 && c.dst_cols % per_word == 0 &&
      c.src_ld % per_word == 0 && c.dst_ld % per_word == 0 && aligned16(c.src) &&
      aligned16(c.dst)) {
    launch("moe_copy_rows", copy_rows_kernel<int4>, full_grid(), stream, c, per_word);
    return;
  }
  switch (elem) {
    case 4:
      launch("moe_copy_rows", copy_rows_kernel<uint32_t>, full_grid(), stream, c, int64_t(1));
      return;
    case 2:
      launch("moe_copy_rows", copy_rows_kernel<uint16_t>, full_grid(), stream, c, int64_t(1));
      return;
    default:
      throw Error(detail::cat("MoE copy_rows: no kernel for ", elem, "-byte elements"));
  }
}

void launch_gather_rows(const GatherRows& g, int elem, cudaStream_t stream) {
  if (int64_t(g.num_experts) * g.capacity * g.H == 0) return;
  const int64_t row_bytes = int64_t(g.H) * elem;
  if (aligned16(row_bytes) && aligned16(g.x) && aligned16(g.gathered)) {
    launch("moe_gather_rows", gather_rows_kernel<int4>, full_grid(), stream, g,
           row_bytes / int64_t(sizeof(int4)));
    return;
  }
  switch (elem) {
    case 4:
      launch("moe_gather_rows", gather_rows_kernel<uint32_t>, full_grid(), stream, g,
             int64_t(g.H));
      return;
    case 2:
      launch("moe_gather_rows", gather_rows_kernel<uint16_t>, full_grid(), stream, g,
             int64_t(g.H));
      return;
    default:
      throw Error(detail::cat("MoE gather_rows: no kernel for ", elem, "-byte elements"));
  }
}

void launch_activate(const Activate& a, DType dtype, cudaStream_t stream) {
  if (a.rows * a.width == 0) return;
  const LiveRows live = live_rows(a.rows, a.row_limits, a.group_rows);
  const int64_t ld = a.act == int(Activation::swiglu) ? 2 * a.width : a.width;
  for_dtype("MoE activate", dtype, [&](auto t) {
    using T = decltype(t);
    if (a.width % kWide == 0 && aligned16(a.hidden) && aligned16(a.out) &&
        aligned16(ld * int64_t(sizeof(float))) && aligned16(a.out_ld * int64_t(sizeof(T))))
      launch("moe_activate", activate_kernel<T, kWide>, full_grid(), stream, a, live);
    else
      launch("moe_activate", activate_kernel<T, 1>, full_grid(), stream, a, live);
  });
}

void launch_weighted_sum(const WeightedSum& w, DType dtype, cudaStream_t stream) {
  if (int64_t(w.m) * w.O == 0) return;
  for_dtype("MoE weighted_sum", dtype, [&](auto t) {
    using T = decltype(t);
    if (w.O % kWide == 0 && aligned16(w.rows) && aligned16(w.y))
      launch("moe_weighted_sum", weighted_sum_kernel<T, kWide>, full_grid(), stream, w);
    else
      launch("moe_weighted_sum", weighted_sum_kernel<T, 1>, full_grid(), stream, w);
  });
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
