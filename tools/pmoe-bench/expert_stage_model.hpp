// The expert stage's model: one rank's expert stage of a 16-bit swiglu MoE layer (every row of
// its experts, grouped by expert) priced on a named GPU, pmoe's and torch._grouped_mm's side by
// side, as `pmoe-bench moe --device cuda` times them (pmoe: MoeStats::experts_s; torch:
// tools/torch_grouped_mm.py). The kernel model (kernel_model.hpp) prices kernels from the
// emulated device's counts; here the GEMMs are a library's (CUTLASS's grouped GEMM on both
// sides), which the emulated device does not count, so they are a roofline of their tiles, and
// the kernels around them are the bytes they move, which tests/cuda/test_cuda_moe_bytes.cpp holds
// against the emulated device's counts (ExpertStageModel.*).
//
// A grouped GEMM D_g [m_g, n] = A_g [m_g, k] . B_g [k, n] over the groups, tiles of `tile_rows`
// rows (the library computes whole tiles: an expert's partial tile costs a full one):
//
//   t = launch + max(issued FLOPs / tensor peak, (A + B) / HBM) + D / HBM
//
//   issued FLOPs = 2 n k sum_g ceil(m_g / tile_rows) tile_rows
//   A = rows in use x k, B = k n a group with rows (its expert's weights, read once), both 16-bit
//
// The operands stream under the tensor cores (TMA, a multi-stage pipeline), so the mainloop is
// whichever of the two is longer; D is stored after each tile's mainloop (the cooperative
// schedule pmoe's sm90 kernel uses: no overlap of a tile's stores with the next tile's loads), so
// it adds. Both sides get the same form, so the bytes pmoe stores wider (f32 D) count against it
// in full. A kernel around the GEMMs: launch + (bytes read + written) / HBM.
//
// Each side's kernels, in stream order (rows = tokens x top_k, s = 2 bytes, E' experts with rows):
//
//   pmoe   moe_group_pairs       indices -> each expert's rows (E blocks, each reading them)
//          moe_gather_rows       x rows -> the experts' rows: rows H s read and written
//          plan_groups           one block: both GEMMs' per-expert arrays from the counts
//          library_grouped_gemm  GEMM 1: [rows, H] . [H, 2F] -> f32 (128-row tiles)
//          moe_activate          f32 [rows, 2F] -> [rows, F] s
//          library_grouped_gemm  GEMM 2: [rows, F] . [F, O] -> f32 (128-row tiles)
//   torch  grouped_mm 1      prepare_grouped_gemm_data (1 block), then the GEMM -> bf16
//          silu              hidden[:, :F] -> [rows, F] bf16
//          mul               silu(...) x hidden[:, F:] -> [rows, F] bf16
//          grouped_mm 2      prepare, then the GEMM -> bf16
//
// torch's tile (ATen's GroupMM.cu on sm90): 128 x 256 x 64 where the mean group has more than
// 128 rows and n > 128, else 64 x 128 x 128; pmoe's sm90 kernel is always 128 x 256 x 64.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernel_model.hpp"

namespace pmoe::bench {

// One rank's expert stage: the layer's widths and each of its experts' rows.
struct ExpertStageShape {
  int64_t feature = 0;  // H: GEMM 1's k, the gathered rows' width
  int64_t ffn = 0;      // F: swiglu's GEMM 1 writes 2F, GEMM 2's k
  int64_t output = 0;   // O: GEMM 2's n
  int64_t tokens = 0;   // m
  int top_k = 0;
  std::vector<int64_t> group_rows;  // each expert's rows; they sum to m x top_k
  int64_t rows() const;
};

// One GEMM priced as above.
struct GroupedGemm {
  std::vector<int64_t> group_rows;
  int64_t n = 0, k = 0;
  int tile_rows = 128;
  int out_bytes = 2;  // D's element: 4 for f32, 2 for bf16
};

struct StageKernel {
  std::string kernel;  // pmoe's: the name the emulated device counts it under
  std::string what;    // e.g. "GEMM 1, f32 out" (or "")
  double bytes = 0;         // read + written
  double issued_flops = 0;  // a GEMM's, its tiles' (0 elsewhere)
  double us = 0;
};
StageKernel predict_grouped_gemm(const GpuSpec& gpu, const std::string& name,
                                 const std::string& what, const GroupedGemm& g);

struct StagePrediction {
  std::vector<StageKernel> kernels;
  double us = 0;
  double used_flops = 0;  // the two GEMMs' FLOPs of the rows in use, as pmoe-bench counts them
  double tflops() const { return us > 0 ? used_flops / us * 1e-6 : 0; }
  const StageKernel* find(const std::string& kernel) const;
};

struct ExpertStagePrediction {
  StagePrediction pmoe, torch;
  double ratio() const { return pmoe.us > 0 ? torch.us / pmoe.us : 0; }  // pmoe's rate / torch's
};

// pmoe's stage and torch's on `gpu` (bf16 layers; throws pmoe::Error on an inconsistent shape).
ExpertStagePrediction predict_expert_stage(const GpuSpec& gpu, const ExpertStageShape& shape);

// The bytes of pmoe's kernels around the GEMMs in one forward, as the model charges them: what
// the emulated device's counts of the same kernels are held to. group_pairs' index reads are
// plain loads the device does not count (E blocks read the same m k words, from L2 but once).
struct StageRowKernelBytes {
  double group_pairs_read = 0, group_pairs_written = 0;
  double gather_read = 0, gather_written = 0;
  double activate_read = 0, activate_written = 0;
};
StageRowKernelBytes pmoe_row_kernel_bytes(const ExpertStageShape& shape, int element_bytes = 2);

}  // namespace pmoe::bench
