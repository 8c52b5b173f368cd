// What the two CUTLASS grouped GEMMs (grouped_gemm_sm90.cu, grouped_gemm_sm80.cu) do alike once
// their arguments are built: the workspace check, can_implement, initialize and the launch, each
// refusal a pmoe::Error naming the call; and the device's multiprocessors. Only those two files
// include it: it needs CUTLASS's headers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include <cutlass/cutlass.h>

#include "cuda/check.hpp"
#include "cuda/gemm/library_grouped_gemm.cuh"
#include "cuda/sm_count.hpp"
#include "pmoe/error.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

// Gemm: CUTLASS 2's GemmGrouped or CUTLASS 3's GemmUniversalAdapter; `what` names it.
template <typename Gemm>
void run_cutlass(const char* what, const typename Gemm::Arguments& args,
                 const LibraryGroupedGemm& g, cudaStream_t stream) {
  Gemm gemm;
  const size_t need = gemm.get_workspace_size(args);
  PMOE_CHECK(g.workspace_bytes >= need, what, ": workspace of ", g.workspace_bytes,
             " bytes, it needs ", need);
  cutlass::Status status = gemm.can_implement(args);
  PMOE_CHECK(status == cutlass::Status::kSuccess, what, ": cannot implement ", g.groups,
             " groups of n ", g.n, ", k ", g.k, ": ", cutlassGetStatusString(status));
  status = gemm.initialize(args, g.workspace, stream);
  PMOE_CHECK(status == cutlass::Status::kSuccess, what, ": initialize: ",
             cutlassGetStatusString(status));
  status = gemm.run(stream);
  PMOE_CHECK(status == cutlass::Status::kSuccess, what, ": launch: ",
             cutlassGetStatusString(status), " (", cudaGetErrorString(cudaGetLastError()), ")");
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
