// The grouped expert GEMM on tensor cores (grouped_gemm.cuh). Work item w = (tile, column
// block): the blocks take w = blockIdx.x, + gridDim.x, ... below live tiles x column blocks.
// Per item, K is staged in chunks of kChunk through shared memory (zero past k, past n and
// below the tile's rows), each warp multiplies its m8n32k16 fragments there, and the f32 results
// go out through a per-warp staging tile (rows < T, columns < n only):
//
//   a_s   [kMaxRows, kChunk] 16-bit      the tile's rows, columns k0 .. k0 + kChunk
//   b_s   [kChunk, columns] 16-bit       B's rows k0 .., the block's columns
//   c_s   [warps, 8, 32] f32             one fragment's results, for the bounded copy out
//
// Fragment f of a block tile (rows / 8 by columns / 32 of them) belongs to warp f % kWarps.
// Staging goes element by element, so any k, n, lda, ldb and tile start are allowed (a tile
// moved back to end at its expert's count starts at any row).
#include "cuda/gemm/grouped_gemm.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "cuda/launch.cuh"
#include "cuda/memory_ops.cuh"
#include "pmoe/error.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kFragRows = 8, kFragCols = 32, kFragK = 16;  // m8n32k16: 8 token rows a fragment
constexpr int kChunk = 2 * kFragK;                         // K staged per pass
constexpr int kWarps = kBlockThreads / 32;
constexpr int kMaxRows = 128;                              // expert_tiles.hpp's largest tile
constexpr int kMaxColumns = 256;                           // block_columns(8, n)
constexpr int kMaxFragsPerWarp = kMaxRows / kFragRows * 2 / kWarps;  // 64 columns at 128 rows

__device__ __forceinline__ int padded_rows(int tile_rows) {
  return (tile_rows + kFragRows - 1) / kFragRows * kFragRows;
}
// 256, 128 or 64 columns, so that 8 rows have 8 fragments of 32 columns (one a warp); no more
// than n rounded up to 32.
__device__ __forceinline__ int block_columns(int tile_rows, int n) {
  const int rows = padded_rows(tile_rows);
  const int columns = rows <= 8 ? 256 : rows <= 16 ? 128 : 64;
  return min(columns, (n + kFragCols - 1) / kFragCols * kFragCols);
}

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) grouped_gemm_kernel(const GroupedGemm g) {
  alignas(32) __shared__ T a_s[kMaxRows * kChunk];
  alignas(32) __shared__ T b_s[kChunk * kMaxColumns];
  alignas(32) __shared__ float c_s[kWarps * kFragRows * kFragCols];
  const int rows = padded_rows(g.tile_rows), columns = block_columns(g.tile_rows, g.n);
  const int column_blocks = (g.n + columns - 1) / columns;
  const int frag_columns = columns / kFragCols, frags = rows / kFragRows * frag_columns;
  const int per_warp = (frags + kWarps - 1) / kWarps;  // the same in every warp: barriers below
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int live = min(*g.live_tiles, g.max_tiles);
  int64_t rows_computed = 0;
  const T zero{};  // +0

  for (int64_t w = blockIdx.x; w < int64_t(live) * column_blocks; w += gridDim.x) {
    const int tile = int(w / column_blocks), n0 = int(w % column_blocks) * columns;
    if (n0 == 0) rows_computed += rows;  // the fragments' rows: T rounded up to 8
    const T* a = static_cast<const T*>(g.a[tile]);
    const T* b = static_cast<const T*>(g.b[tile]);
    wmma::fragment<wmma::accumulator, kFragRows, kFragCols, kFragK, float> acc[kMaxFragsPerWarp];
PMOE_UNROLL
    for (int i = 0; i < kMaxFragsPerWarp; ++i) wmma::fill_fragment(acc[i], 0.0f);
    for (int k0 = 0; k0 < g.k; k0 += kChunk) {
      __syncthreads();  // the previous chunk (or item) is read
      for (int e = int(threadIdx.x); e < rows * kChunk; e += kBlockThreads) {
        const int r = e / kChunk, c = e % kChunk;
        a_s[e] = r < g.tile_rows && k0 + c < g.k ? a[r * g.lda + k0 + c] : zero;
      }
      for (int e = int(threadIdx.x); e < kChunk * columns; e += kBlockThreads) {
        const int r = e / columns, c = e % columns;
        b_s[e] = k0 + r < g.k && n0 + c < g.n ? b[(k0 + r) * g.ldb + n0 + c] : zero;
      }
      __syncthreads();
PMOE_UNROLL  // constant indices keep acc in registers
      for (int i = 0; i < kMaxFragsPerWarp; ++i) {
        const int f = warp + kWarps * i;
        if (i >= per_warp || f >= frags) break;
        const int fr = f / frag_columns, fc = f % frag_columns;
PMOE_UNROLL
        for (int kk = 0; kk < kChunk; kk += kFragK) {
          wmma::fragment<wmma::matrix_a, kFragRows, kFragCols, kFragK, T, wmma::row_major> af;
          wmma::fragment<wmma::matrix_b, kFragRows, kFragCols, kFragK, T, wmma::row_major> bf;
          wmma::load_matrix_sync(af, a_s + fr * kFragRows * kChunk + kk, kChunk);
          wmma::load_matrix_sync(bf, b_s + kk * columns + fc * kFragCols, columns);
          wmma::mma_sync(acc[i], af, bf, acc[i]);
        }
      }
    }
    float* c = static_cast<float*>(g.c[tile]);
PMOE_UNROLL
    for (int i = 0; i < kMaxFragsPerWarp; ++i) {
      if (i >= per_warp) break;  // the same in every warp: the barriers below are the block's
      const int f = warp + kWarps * i;
      float* staged = c_s + warp * kFragRows * kFragCols;
      if (f < frags) wmma::store_matrix_sync(staged, acc[i], kFragCols, wmma::mem_row_major);
      __syncthreads();  // every lane's share of the fragment is in c_s
      if (f < frags) {
        const int fr = f / frag_columns, fc = f % frag_columns;
        for (int e = lane; e < kFragRows * kFragCols; e += 32) {
          const int r = fr * kFragRows + e / kFragCols, col = n0 + fc * kFragCols + e % kFragCols;
          if (r < g.tile_rows && col < g.n) store_to_peer(c + r * g.ldc + col, staged[e]);
        }
      }
      __syncthreads();  // c_s is read before the next fragment's store
    }
  }
  if (g.issued != nullptr && threadIdx.x == 0) g.issued[blockIdx.x] = rows_computed;
}

}  // namespace

void launch_grouped_gemm(const GroupedGemm& g, DType inputs, int blocks, cudaStream_t stream) {
  PMOE_CHECK(g.tile_rows > 0 && g.tile_rows <= kMaxRows, "grouped GEMM: tiles of ", g.tile_rows,
             " rows, expected 1 to ", kMaxRows);
  if (blocks <= 0 || g.max_tiles == 0) return;
  switch (inputs) {
    case DType::bf16:
      launch(grouped_gemm_kernel<__nv_bfloat16>, blocks, stream, g);
      return;
    case DType::f16:
      launch(grouped_gemm_kernel<__half>, blocks, stream, g);
      return;
    default:
      throw Error(detail::cat("grouped GEMM: no tensor-core kernel for ", dtype_name(inputs),
                              " inputs (bf16 or f16)"));
  }
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
