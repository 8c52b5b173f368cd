// The library grouped GEMM on the emulated device (src/cuda/gemm/library_grouped_gemm.cuh): a
// shim of the libraries' contract, as cublas.cpp is cuBLAS's. CUTLASS's sm_90a kernels cannot be
// compiled for the CPU, so the call is stood in for by one emulated kernel that
//   - checks on the host what the libraries check before a launch (a library for the device,
//     16-bit inputs, the arrays and the workspace there) and throws pmoe::Error as the GPU path
//     does when CUTLASS refuses;
//   - reads the groups' arrays when the stream runs it (a kernel before it wrote them), and
//     checks each group as the hardware would take it: the shape's n and k the call's, every
//     address and row stride a multiple of 16 bytes (TMA faults otherwise: the shim prints
//     the group and aborts, as the emulated device does for any misaligned access);
//   - computes D_g = A_g . B_g for the m rows of each group, f32 sums of the widened (exact)
//     inputs in k order, rows past m untouched. Only the summation order differs from a GPU's.
// Standing in for cutlass_sm90 (the shipped target; sm_80's kernel has the same contract).
#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/check.hpp"
#include "cuda/launch.cuh"
#include "cuda/memory_ops.cuh"
#include "cuda/gemm/library_grouped_gemm.cuh"
#include "cuda/sm_count.hpp"
#include "pmoe/error.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

constexpr size_t kDescriptorBytes = 128;  // a TMA descriptor; CUTLASS 3 keeps 3 per multiprocessor

bool misaligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kLibraryAlignBytes != 0;
}

[[noreturn]] void fault(int group, const char* what, const GroupShape& s, int64_t lda,
                        int64_t ldb, int64_t ldd) {
  std::fprintf(stderr,
               "pmoe emulated device: library grouped GEMM: group %d: %s (m %d n %d k %d, lda "
               "%" PRId64 " ldb %" PRId64 " ldd %" PRId64 "): a GPU faults here\n",
               group, what, s.m, s.n, s.k, lda, ldb, ldd);
  std::abort();
}

template <typename T>
float widen(T v);
template <>
float widen(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
float widen(__half v) {
  return __half2float(v);
}

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) library_gemm_shim(const LibraryGroupedGemm g) {
  for (int group = int(blockIdx.x); group < g.groups; group += int(gridDim.x)) {
    const GroupShape s = g.arrays.shapes[group];
    const int64_t lda = g.arrays.lda[group], ldb = g.arrays.ldb[group], ldd = g.arrays.ldd[group];
    const T* a = static_cast<const T*>(g.arrays.a[group]);
    const T* b = static_cast<const T*>(g.arrays.b[group]);
    float* d = static_cast<float*>(g.arrays.d[group]);
    if (threadIdx.x == 0) {
      const int64_t elem = int64_t(sizeof(T));
      if (s.m < 0 || s.n != g.n || s.k != g.k) fault(group, "shape unlike the call's", s, lda, ldb, ldd);
      if (s.m > 0 && (lda < s.k || ldb < s.n || ldd < s.n)) fault(group, "row stride below the width", s, lda, ldb, ldd);
      if (s.m > 0 && (misaligned(a) || misaligned(b) || misaligned(d) || (lda * elem) % kLibraryAlignBytes ||
          (ldb * elem) % kLibraryAlignBytes || (ldd * 4) % kLibraryAlignBytes))
        fault(group, "an address or row stride not a multiple of 16 bytes", s, lda, ldb, ldd);
    }
    if (s.m == 0) continue;  // an empty group: skipped, as the libraries' schedulers do
    for (int64_t e = threadIdx.x; e < int64_t(s.m) * s.n; e += kBlockThreads) {
      const int64_t r = e / s.n, c = e % s.n;
      float sum = 0.0f;
      for (int64_t i = 0; i < s.k; ++i) sum += widen(a[r * lda + i]) * widen(b[i * ldb + c]);
      store_to_peer(d + r * ldd + c, sum);
    }
  }
}

}  // namespace

GemmLibrary gemm_library_for(int device) {
  (void)sm_count(device);  // a device that does not exist is an error here too
  return GemmLibrary::cutlass_sm90;
}

size_t library_workspace_bytes(GemmLibrary library, int, int device) {
  if (library == GemmLibrary::none) return 0;
  return 3 * kDescriptorBytes * size_t(sm_count(device));
}

void launch_library_grouped_gemm(const LibraryGroupedGemm& g, cudaStream_t stream) {
  PMOE_CHECK(g.library != GemmLibrary::none, "library grouped GEMM: no library for device ",
             g.device);
  PMOE_CHECK(g.inputs == DType::bf16 || g.inputs == DType::f16, "library grouped GEMM (",
             gemm_library_name(g.library), "): ", dtype_name(g.inputs),
             " inputs, expected bf16 or f16");
  PMOE_CHECK(g.groups >= 0 && g.n > 0 && g.k > 0, "library grouped GEMM (",
             gemm_library_name(g.library), "): ", g.groups, " groups of n ", g.n, ", k ", g.k);
  if (g.groups == 0) return;
  PMOE_CHECK(g.arrays.shapes && g.arrays.a && g.arrays.b && g.arrays.d && g.arrays.lda &&
                 g.arrays.ldb && g.arrays.ldd,
             "library grouped GEMM (", gemm_library_name(g.library), "): an array is null");
  const size_t need = library_workspace_bytes(g.library, g.groups, g.device);
  PMOE_CHECK(g.workspace_bytes >= need && (need == 0 || g.workspace != nullptr),
             "library grouped GEMM (", gemm_library_name(g.library), "): workspace of ",
             g.workspace_bytes, " bytes, it needs ", need);
  const int blocks = std::min(g.groups, grid_blocks(sm_count(g.device)));
  switch (g.inputs) {
    case DType::bf16:
      launch("library_grouped_gemm", library_gemm_shim<__nv_bfloat16>, blocks, stream, g);
      return;
    case DType::f16:
      launch("library_grouped_gemm", library_gemm_shim<__half>, blocks, stream, g);
      return;
    default:
      return;  // checked above
  }
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
