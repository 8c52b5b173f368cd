// The expert GEMMs of a MoE layer on a device, behind one interface: what the layers call to run
// them (src/cuda/moe/device_experts.hpp), and the one place that picks the engine each GEMM runs
// on. An ExpertGemms serves a layer's GEMMs over `groups` groups of rows (its experts), each
//
//   D_g [m_g, n] f32 = A_g [m_g, k] . B_g [k, n]      m_g: group g's rows in use, on the device
//
// with f32 accumulation, on one of these engines (the files beside this one):
//
//   engine              inputs     computes                            file
//   cuBLAS batched      f32        a batch of tiles the host sizes     batched_gemm.hpp
//   pmoe grouped (wmma) bf16, f16  the live tiles, a device count      grouped_gemm.cuh
//   CUTLASS sm90, sm80  bf16, f16  each group's m_g rows               library_grouped_gemm.cuh
//
// (on the emulated device the library is a shim of CUTLASS's contract standing in for sm90,
// library_grouped_gemm_emulated.cpp). The choice: f32 layers take cuBLAS's batch, in f32 or on
// TF32 tensor cores; 16-bit layers take the library where the build has one for the device and
// it serves the GEMM's operands (library_can_serve: every operand 16-byte aligned, n and k at
// least kLibraryMinWidth), else pmoe's kernel. The library is decided per GEMM and per call, on
// the host, from the pointers; the rest once, at construction. PMOE_EXPERT_GEMM=own keeps every
// 16-bit GEMM on pmoe's kernel, =library sends every one the library can serve there, narrow ones
// too (to compare the two on a GPU).
//
// The two tile engines read arrays of tile addresses that a plan kernel before them wrote from
// the counts (src/cuda/moe/moe_kernels.cuh, PlanTiles, over tiles of expert_tiles.hpp); the
// library reads per-group arrays that plan_groups() writes from the counts. So the host never reads
// a count, and a call can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/flavor.hpp"
#include "cuda/gemm/batched_gemm.hpp"
#include "cuda/gemm/library_grouped_gemm.cuh"
#include "pmoe/dtype.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

enum class ExpertGemmEngine { cublas_batched, pmoe_wmma, cutlass_sm90, cutlass_sm80 };
// The engine's name in reports (MoeStats::expert_gemm, `pmoe-bench moe --device cuda`); `tf32`
// says which cuBLAS batch.
const char* expert_gemm_engine_name(ExpertGemmEngine engine, bool tf32);

// The engines of one call's GEMMs (a layer has two: x . W1, then act . W2), as choose() or
// tile_choice() set them.
struct ExpertGemmChoice {
  static constexpr int kGemms = PlanGroups::kMaxGemms;
  ExpertGemmEngine engine[kGemms] = {ExpertGemmEngine::cublas_batched,
                                     ExpertGemmEngine::cublas_batched};
  bool library(int i) const {
    return engine[i] == ExpertGemmEngine::cutlass_sm90 ||
           engine[i] == ExpertGemmEngine::cutlass_sm80;
  }
  // Some GEMM runs over the tile plan (its arrays must be written first).
  bool tiles() const { return !library(0) || !library(1); }
  bool groups() const { return library(0) || library(1); }
};

// One GEMM of a call, in the two forms the engines read. `groups`: group g's A, B and D at
// a + g a_step, ... (bytes), with the row strides, n and k; the library reads these, and the
// tile engines their row strides, n and k. The tile plan's arrays (device, [max_tiles] each):
// tile t's first row of A and of D and its B, for the tile engines.
struct ExpertGemm {
  LibraryOperands groups;
  const void* const* a_tiles = nullptr;
  const void* const* b_tiles = nullptr;
  void* const* d_tiles = nullptr;
  int tile_rows = 0, max_tiles = 0;
  const int32_t* live_tiles = nullptr;  // device: the plan's live tiles (pmoe's kernel reads it)
  int64_t* issued = nullptr;  // pmoe's kernel: [blocks()] rows each block computed, or null
};

class ExpertGemms {
 public:
  // GEMMs with `inputs` of the layer's dtype (f32 on TF32 tensor cores where `tf32`) over
  // `groups` groups on `device`; allocates what the engines need (the library's arrays and
  // workspace) on the device.
  ExpertGemms(DType inputs, bool tf32, int groups, Device device);

  // The engine of the GEMMs the library does not take: cuBLAS's batch (f32) or pmoe's kernel.
  ExpertGemmEngine tile_engine() const { return tile_engine_; }
  // The library this object's 16-bit GEMMs may take (none: pmoe's kernel for all of them).
  GemmLibrary library() const { return library_; }
  // pmoe's kernel's grid, the size of ExpertGemm::issued (0 where the layer is f32).
  int blocks() const { return blocks_; }
  size_t workspace_bytes() const { return group_arrays_.nbytes() + library_workspace_.nbytes(); }
  const char* name(ExpertGemmEngine engine) const { return expert_gemm_engine_name(engine, tf32_); }

  // Every GEMM on the tile engine: what a layer reports before its first call that had rows.
  ExpertGemmChoice tile_choice() const {
    ExpertGemmChoice c;
    for (ExpertGemmEngine& e : c.engine) e = tile_engine_;
    return c;
  }
  // The engine of each of a call's GEMMs, from their operands (host arithmetic on the pointers).
  ExpertGemmChoice choose(const LibraryOperands (&gemms)[ExpertGemmChoice::kGemms]) const;
  // Writes, on `stream`, the group arrays of the GEMMs `choice` gives the library, from the
  // counts (device, [groups], each group's rows in use, capped at group_rows), with PlanGroups'
  // tally (tally[used], tally[rows]; a negative index: not written). Nothing where none is.
  void plan_groups(const ExpertGemmChoice& choice,
                   const LibraryOperands (&gemms)[ExpertGemmChoice::kGemms], const int32_t* counts,
                   int64_t group_rows, int64_t* tally, int used, int rows,
                   cudaStream_t stream) const;
  // Enqueues GEMM i of the call on its engine (`handle`: cuBLAS's, on `stream`). Throws
  // pmoe::Error where the engine refuses its arguments.
  void run(const ExpertGemmChoice& choice, int i, const ExpertGemm& gemm, cublasHandle_t handle,
           cudaStream_t stream) const;

 private:
  GroupArrays arrays(int i) const;  // GEMM i's library arrays

  DType inputs_;
  bool tf32_;
  int groups_;
  int device_;
  ExpertGemmEngine tile_engine_;
  int blocks_ = 0;
  GemmLibrary library_ = GemmLibrary::none;
  bool force_library_ = false;
  size_t library_workspace_bytes_ = 0;
  // [kGemms][group_arrays_bytes] (GEMM i's arrays), and the library's workspace.
  Buffer group_arrays_, library_workspace_;
};

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
