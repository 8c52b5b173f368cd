// The library grouped GEMM's flavour-independent half (library_grouped_gemm.cuh): the arrays'
// layout, the host's check of what the libraries need, and the kernel that writes the groups'
// arrays from the counts. The library call itself is the flavour's: library_grouped_gemm_gpu.cu
// under nvcc, library_grouped_gemm_emulated.cpp on the emulated device.
//
//   one block; thread i takes groups i, i + 256, ...:
//     counts [groups] --> per GEMM: shapes, a, b, d, lda, ldb, ldd [groups] (store_to_peer: the
//                         library's kernel, next on the stream, reads them)
//     partial [256] int64 (shared): each thread's rows in use and library rows, summed by
//                         thread 0 in thread order into the tally
#include "cuda/gemm/library_grouped_gemm.cuh"

#include <cstdint>

#include "cuda/launch.cuh"
#include "cuda/memory_ops.cuh"
#include "pmoe/error.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

constexpr size_t kArrayAlign = 256;

size_t aligned(size_t bytes) { return (bytes + kArrayAlign - 1) / kArrayAlign * kArrayAlign; }

bool aligned_to(int64_t value) { return value % kLibraryAlignBytes == 0; }
bool aligned_to(const void* p) { return reinterpret_cast<uintptr_t>(p) % kLibraryAlignBytes == 0; }

__global__ void __launch_bounds__(kBlockThreads) plan_groups_kernel(const PlanGroups p) {
  __shared__ int64_t used_by[kBlockThreads], rows_by[kBlockThreads];
  int64_t used = 0, rows = 0;
  for (int g = int(threadIdx.x); g < p.groups; g += kBlockThreads) {
    const int64_t count = p.counts[g];
    const int32_t m = int32_t(count < p.group_rows ? count : p.group_rows);
    used += m;
    rows += int64_t(m + kLibraryTileRows - 1) / kLibraryTileRows * kLibraryTileRows;
    for (int i = 0; i < p.gemms; ++i) {
      const LibraryOperands& o = p.gemm[i].operands;
      const GroupArrays& out = p.gemm[i].arrays;
      GroupShape shape;
      shape.m = m;
      shape.n = o.n;
      shape.k = o.k;
      store_to_peer(out.shapes + g, shape);
      store_to_peer(out.a + g, static_cast<const void*>(static_cast<const char*>(o.a) + g * o.a_step));
      store_to_peer(out.b + g, static_cast<const void*>(static_cast<const char*>(o.b) + g * o.b_step));
      store_to_peer(out.d + g, static_cast<void*>(const_cast<char*>(static_cast<const char*>(o.d)) +
                                                  g * o.d_step));
      store_to_peer(out.lda + g, o.lda);
      store_to_peer(out.ldb + g, o.ldb);
      store_to_peer(out.ldd + g, o.ldd);
    }
  }
  if (p.tally == nullptr) return;  // the same in every thread: no barrier is skipped by some
  used_by[threadIdx.x] = used;
  rows_by[threadIdx.x] = rows;
  __syncthreads();
  if (threadIdx.x != 0) return;
  int64_t used_sum = 0, rows_sum = 0;
  for (int i = 0; i < kBlockThreads; ++i) {
    used_sum += used_by[i];
    rows_sum += rows_by[i];
  }
  if (p.used >= 0) p.tally[p.used] = used_sum;
  if (p.rows >= 0) p.tally[p.rows] = rows_sum;
}

}  // namespace

size_t group_arrays_bytes(int groups) {
  const size_t n = size_t(groups > 0 ? groups : 0);
  return aligned(n * sizeof(GroupShape)) + 3 * aligned(n * sizeof(void*)) +
         3 * aligned(n * sizeof(int64_t));
}

GroupArrays group_arrays_at(void* base, int groups) {
  const size_t n = size_t(groups > 0 ? groups : 0);
  char* at = static_cast<char*>(base);
  auto take = [&](size_t bytes) {
    char* here = at;
    at += aligned(bytes);
    return here;
  };
  GroupArrays a;
  a.shapes = reinterpret_cast<GroupShape*>(take(n * sizeof(GroupShape)));
  a.a = reinterpret_cast<const void**>(take(n * sizeof(void*)));
  a.b = reinterpret_cast<const void**>(take(n * sizeof(void*)));
  a.d = reinterpret_cast<void**>(take(n * sizeof(void*)));
  a.lda = reinterpret_cast<int64_t*>(take(n * sizeof(int64_t)));
  a.ldb = reinterpret_cast<int64_t*>(take(n * sizeof(int64_t)));
  a.ldd = reinterpret_cast<int64_t*>(take(n * sizeof(int64_t)));
  return a;
}

const char* gemm_library_name(GemmLibrary library) {
  switch (library) {
    case GemmLibrary::cutlass_sm90: return "CUTLASS 3 grouped GEMM (sm_90a: TMA, wgmma)";
    case GemmLibrary::cutlass_sm80: return "CUTLASS 2 GemmGrouped (sm_80: cp.async, mma.sync)";
    case GemmLibrary::none: break;
  }
  return "none";
}

bool library_can_serve(const LibraryOperands& o, DType inputs, bool below_min_width_too) {
  if (inputs != DType::bf16 && inputs != DType::f16) return false;
  if (o.n <= 0 || o.k <= 0) return false;
  if (!below_min_width_too && (o.n < kLibraryMinWidth || o.k < kLibraryMinWidth)) return false;
  const int64_t elem = int64_t(dtype_size(inputs)), out = int64_t(sizeof(float));
  // Row strides at least the rows' widths, and every address a group starts at 16-byte aligned.
  // Widths whole 16-byte vectors too (CUTLASS 2 reads and writes in those; TMA's boxes need not).
  return o.lda >= o.k && o.ldb >= o.n && o.ldd >= o.n && aligned_to(o.k * elem) &&
         aligned_to(o.n * elem) && aligned_to(o.n * out) && aligned_to(o.lda * elem) &&
         aligned_to(o.ldb * elem) && aligned_to(o.ldd * out) && aligned_to(o.a) &&
         aligned_to(o.b) && aligned_to(o.d) && aligned_to(o.a_step) && aligned_to(o.b_step) &&
         aligned_to(o.d_step);
}

void launch_plan_groups(const PlanGroups& p, cudaStream_t stream) {
  PMOE_CHECK(p.gemms >= 0 && p.gemms <= PlanGroups::kMaxGemms, "plan_groups: ", p.gemms,
             " GEMMs, at most ", PlanGroups::kMaxGemms);
  if (p.groups <= 0) return;
  launch("plan_groups", plan_groups_kernel, 1, stream, p);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
