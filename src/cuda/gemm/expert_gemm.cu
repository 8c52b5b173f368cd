// The expert GEMMs' engine choice and their launches (expert_gemm.hpp). Host code only: the
// kernels are the engines' own (grouped_gemm.cu, library_grouped_gemm.cu and its twins, cuBLAS).
#include "cuda/gemm/expert_gemm.hpp"

#include <cstdlib>
#include <string_view>

#include "cuda/gemm/grouped_gemm.cuh"
#include "cuda/launch.cuh"
#include "cuda/sm_count.hpp"
#include "pmoe/error.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {
namespace {

// PMOE_EXPERT_GEMM: "own", "library", or anything else (unset: "auto").
std::string_view gemm_choice() {
  const char* v = std::getenv("PMOE_EXPERT_GEMM");
  return v ? std::string_view(v) : std::string_view("auto");
}

ExpertGemmEngine library_engine(GemmLibrary library) {
  return library == GemmLibrary::cutlass_sm80 ? ExpertGemmEngine::cutlass_sm80
                                              : ExpertGemmEngine::cutlass_sm90;
}

}  // namespace

const char* expert_gemm_engine_name(ExpertGemmEngine engine, bool tf32) {
  switch (engine) {
    case ExpertGemmEngine::cublas_batched:
      return tf32 ? "cuBLAS batched GEMM (TF32)" : "cuBLAS batched GEMM (f32)";
    case ExpertGemmEngine::pmoe_wmma:
      return "pmoe grouped GEMM (wmma)";
    case ExpertGemmEngine::cutlass_sm90:
      return "CUTLASS sm90 grouped GEMM";
    case ExpertGemmEngine::cutlass_sm80:
      return "CUTLASS sm80 grouped GEMM";
  }
  return "?";
}

ExpertGemms::ExpertGemms(DType inputs, bool tf32, int groups, Device device)
    : inputs_(inputs),
      tf32_(tf32),
      groups_(groups),
      device_(device.index),
      // cuBLAS has no 16-bit batch whose size the device sets, and pmoe's kernel no f32 one.
      tile_engine_(inputs == DType::f32 ? ExpertGemmEngine::cublas_batched
                                        : ExpertGemmEngine::pmoe_wmma) {
  if (tile_engine_ == ExpertGemmEngine::pmoe_wmma) {
    blocks_ = grid_blocks(sm_count(device.index));
    const std::string_view choice = gemm_choice();
    force_library_ = choice == "library";
    if (choice != "own") library_ = gemm_library_for(device.index);
  }
  if (library_ == GemmLibrary::none) return;
  const size_t bytes = group_arrays_bytes(groups);
  group_arrays_ = Buffer(DType::i64, {ExpertGemmChoice::kGemms, int64_t((bytes + 7) / 8)}, device);
  library_workspace_bytes_ = library_workspace_bytes(library_, groups, device.index);
  if (library_workspace_bytes_ > 0)
    library_workspace_ = Buffer(DType::i64, {int64_t((library_workspace_bytes_ + 7) / 8)}, device);
}

ExpertGemmChoice ExpertGemms::choose(
    const LibraryOperands (&gemms)[ExpertGemmChoice::kGemms]) const {
  ExpertGemmChoice c;
  for (int i = 0; i < ExpertGemmChoice::kGemms; ++i)
    c.engine[i] =
        library_ != GemmLibrary::none && library_can_serve(gemms[i], inputs_, force_library_)
            ? library_engine(library_)
            : tile_engine_;
  return c;
}

void ExpertGemms::plan_groups(const ExpertGemmChoice& choice,
                              const LibraryOperands (&gemms)[ExpertGemmChoice::kGemms],
                              const int32_t* counts, int64_t group_rows, int64_t* tally, int used,
                              int rows, cudaStream_t stream) const {
  if (!choice.groups()) return;
  PlanGroups p;
  p.counts = counts;
  p.groups = groups_;
  p.group_rows = group_rows;
  for (int i = 0; i < ExpertGemmChoice::kGemms; ++i) {
    if (!choice.library(i)) continue;
    p.gemm[p.gemms].operands = gemms[i];
    p.gemm[p.gemms].arrays = arrays(i);
    ++p.gemms;
  }
  p.tally = tally;
  p.used = used;
  p.rows = rows;
  launch_plan_groups(p, stream);
}

void ExpertGemms::run(const ExpertGemmChoice& choice, int i, const ExpertGemm& gemm,
                      cublasHandle_t handle, cudaStream_t stream) const {
  const LibraryOperands& o = gemm.groups;
  switch (choice.engine[i]) {
    case ExpertGemmEngine::cutlass_sm90:
    case ExpertGemmEngine::cutlass_sm80: {
      LibraryGroupedGemm g;
      g.library = library_;
      g.inputs = inputs_;
      g.groups = groups_;
      g.n = o.n;
      g.k = o.k;
      g.arrays = arrays(i);
      g.workspace = library_workspace_.data<void>();
      g.workspace_bytes = library_workspace_bytes_;
      g.device = device_;
      launch_library_grouped_gemm(g, stream);
      return;
    }
    case ExpertGemmEngine::cublas_batched:
      // The whole batch the host sized: tiles past the live ones compute their scratch rows.
      gemm_arrays_row_major(handle, ExpertGemmTypes{inputs_, tf32_}, gemm.tile_rows, o.n, o.k,
                            gemm.a_tiles, int(o.lda), gemm.b_tiles, int(o.ldb), gemm.d_tiles,
                            int(o.ldd), gemm.max_tiles);
      return;
    case ExpertGemmEngine::pmoe_wmma: {
      GroupedGemm g;
      g.live_tiles = gemm.live_tiles;
      g.max_tiles = gemm.max_tiles;
      g.tile_rows = gemm.tile_rows;
      g.a = gemm.a_tiles;
      g.b = gemm.b_tiles;
      g.c = gemm.d_tiles;
      g.n = o.n;
      g.k = o.k;
      g.lda = o.lda;
      g.ldb = o.ldb;
      g.ldc = o.ldd;
      g.issued = gemm.issued;
      launch_grouped_gemm(g, inputs_, blocks_, stream);
      return;
    }
  }
}

GroupArrays ExpertGemms::arrays(int i) const {
  return group_arrays_at(
      group_arrays_.data<char>() + size_t(i) * (group_arrays_.nbytes() / ExpertGemmChoice::kGemms),
      groups_);
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
