// The experts' grouped GEMM from a library, for 16-bit layers on a device: one GEMM a group (an
// expert), its row count read from device memory by the library's kernel, so the host never
// reads the counts. Which library, and why: docs/grouped_gemm_library.md.
//
//   GPU, sm_90a:  CUTLASS 3's ptr-array grouped GEMM (TMA, wgmma, warp-specialized cooperative
//                 persistent kernel, 128 x 256 x 64 tiles), grouped_gemm_sm90.cu
//   GPU, sm_80+:  CUTLASS 2's GemmGrouped with device-only scheduling (cp.async pipeline, mma.sync,
//                 128 x 128 x 32 tiles), grouped_gemm_sm80.cu
//   emulated:     a shim with the same contract (library_grouped_gemm_emulated.cpp): it
//                 checks what the libraries would need and computes with the reference
//
// A kernel before the library's (PlanGroups, below) writes the groups' arrays from the counts, in
// the layouts both CUTLASS kernels read (one array a field, group g at index g):
//
//   shapes [groups] {m, n, k} int32   m = min(counts[g], group_rows) (0: the group is skipped)
//   a      [groups] const T*          A_g: m rows of k, row stride lda[g] (T bf16 or f16)
//   b      [groups] const T*          B_g: k rows of n, row stride ldb[g]
//   d      [groups] float*            D_g = A_g . B_g: m rows of n f32, row stride ldd[g]
//   lda, ldb, ldd [groups] int64      elements
//
// Both kernels tile a group's rows by kLibraryTileRows: a group of m rows costs
// 128 ceil(m / 128) rows of tensor-core work (the rows past m are never stored).
// They load through 16-byte accesses (TMA on sm_90a), so every A_g, B_g, D_g and row stride must
// be a multiple of 16 bytes: library_can_serve() checks that on the host, before anything runs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/flavor.hpp"
#include "pmoe/dtype.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

struct GroupShape {  // CUTLASS's GemmCoord and cute::Shape<int, int, int>: three int32, m n k
  int32_t m = 0, n = 0, k = 0;
};

struct GroupArrays {
  GroupShape* shapes = nullptr;
  const void** a = nullptr;
  const void** b = nullptr;
  void** d = nullptr;
  int64_t* lda = nullptr;
  int64_t* ldb = nullptr;
  int64_t* ldd = nullptr;
};
// The arrays of `groups` groups laid out from `base` (device memory of group_arrays_bytes()).
size_t group_arrays_bytes(int groups);
GroupArrays group_arrays_at(void* base, int groups);

enum class GemmLibrary { none, cutlass_sm90, cutlass_sm80 };
const char* gemm_library_name(GemmLibrary library);
// The library kernel this build has for `device` (none: the CUTLASS headers were absent at
// configure time, or the device is older than sm_80). On the emulated device: the shim, standing
// in for cutlass_sm90.
GemmLibrary gemm_library_for(int device);

inline constexpr int kLibraryTileRows = 128;  // both kernels' rows a CTA tile
inline constexpr int kLibraryAlignBytes = 16;
// Narrower GEMMs (n or k) stay on pmoe's own kernel (grouped_gemm.cuh): the libraries' tiles are
// 128 to 256 wide and 32 to 64 deep, mostly padding there. No model has such widths; tests do.
inline constexpr int kLibraryMinWidth = 64;

// Whether the library serves a GEMM of these operands: A at `a` (row stride lda), B at `b`
// (ldb), D at `d` (ldd), each group's operands `*_step` bytes after the previous group's, n and
// k as given, `inputs` bf16 or f16. Host arithmetic on the pointer values, no device access.
struct LibraryOperands {
  const void* a = nullptr;
  int64_t lda = 0, a_step = 0;
  const void* b = nullptr;
  int64_t ldb = 0, b_step = 0;
  const void* d = nullptr;
  int64_t ldd = 0, d_step = 0;
  int n = 0, k = 0;
};
bool library_can_serve(const LibraryOperands& o, DType inputs, bool below_min_width_too = false);

struct LibraryGroupedGemm {
  GemmLibrary library = GemmLibrary::none;
  DType inputs = DType::bf16;
  int groups = 0;
  int n = 0, k = 0;  // every group's (the shapes say so too: the kernels read those)
  GroupArrays arrays;
  void* workspace = nullptr;  // device, library_workspace_bytes() of it
  size_t workspace_bytes = 0;
  int device = 0;
};
// The library's scratch for a call with up to `groups` groups on `device` (CUTLASS 3 keeps TMA
// descriptors per multiprocessor there).
size_t library_workspace_bytes(GemmLibrary library, int groups, int device);
// Enqueues the GEMMs on `stream`; the arrays are read when the stream runs them. Throws
// pmoe::Error on arguments the library refuses (naming the library and what it got).
void launch_library_grouped_gemm(const LibraryGroupedGemm& g, cudaStream_t stream);

// The arrays of up to two GEMMs over the same groups (the experts' two), one thread a group, from
// the counts: A_g = a + g a_step (bytes), and so on. With `tally`, also the rows in use,
// tally[used] = sum of m, and the library's rows, tally[rows] = sum of 128 ceil(m / 128)
// (plain stores, host-mapped, read after an event); a negative index: not written.
struct PlanGroups {
  static constexpr int kMaxGemms = 2;
  struct Gemm {
    LibraryOperands operands;
    GroupArrays arrays;
  };
  const int32_t* counts = nullptr;  // [groups] (device)
  int groups = 0, gemms = 0;
  int64_t group_rows = 0;
  Gemm gemm[kMaxGemms];
  int64_t* tally = nullptr;
  int used = -1, rows = -1;  // indices into tally
};
void launch_plan_groups(const PlanGroups& p, cudaStream_t stream);

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
