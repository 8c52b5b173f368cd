// The library grouped GEMM on a GPU (library_grouped_gemm.cuh): which CUTLASS kernel a device
// gets, and the call. sm_90a SASS runs on compute capability 9.0 only, so 9.0 gets the sm90
// kernel; 8.x and newer than 9.0 get the sm80 one (its SASS on 8.x, its PTX JIT-compiled
// beyond). Without CUTLASS's headers at configure time there is none, and the experts stay on
// pmoe's own kernel (grouped_gemm.cuh).
#include "cuda/gemm/library_grouped_gemm.cuh"

#include "cuda/check.hpp"
#include "cuda/gemm/grouped_gemm_cutlass.hpp"
#include "pmoe/error.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

GemmLibrary gemm_library_for(int device) {
  int major = 0, minor = 0;
  PMOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  PMOE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
#if defined(PMOE_HAVE_CUTLASS) && PMOE_HAVE_CUTLASS
  if (major == 9 && minor == 0) return GemmLibrary::cutlass_sm90;
  if (major >= 8) return GemmLibrary::cutlass_sm80;
#endif
  return GemmLibrary::none;
}

size_t library_workspace_bytes(GemmLibrary library, int groups, int device) {
#if defined(PMOE_HAVE_CUTLASS) && PMOE_HAVE_CUTLASS
  switch (library) {
    case GemmLibrary::cutlass_sm90: return cutlass_sm90::workspace_bytes(groups, device);
    case GemmLibrary::cutlass_sm80: return cutlass_sm80::workspace_bytes(groups, device);
    case GemmLibrary::none: break;
  }
#else
  (void)library, (void)groups, (void)device;
#endif
  return 0;
}

void launch_library_grouped_gemm(const LibraryGroupedGemm& g, cudaStream_t stream) {
  PMOE_CHECK(g.library != GemmLibrary::none, "library grouped GEMM: no library for device ",
             g.device, " in this build");
  PMOE_CHECK(g.groups >= 0 && g.n > 0 && g.k > 0, "library grouped GEMM (",
             gemm_library_name(g.library), "): ", g.groups, " groups of n ", g.n, ", k ", g.k);
  PMOE_CHECK(g.inputs == DType::bf16 || g.inputs == DType::f16, "library grouped GEMM (",
             gemm_library_name(g.library), "): ", dtype_name(g.inputs),
             " inputs, expected bf16 or f16");
  if (g.groups == 0) return;
#if defined(PMOE_HAVE_CUTLASS) && PMOE_HAVE_CUTLASS
  if (g.library == GemmLibrary::cutlass_sm90) return cutlass_sm90::run(g, stream);
  return cutlass_sm80::run(g, stream);
#else
  (void)stream;
#endif
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
