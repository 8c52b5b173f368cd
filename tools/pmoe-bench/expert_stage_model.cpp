#include "expert_stage_model.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "pmoe/error.hpp"

namespace pmoe::bench {
namespace {

constexpr int kBlockThreads = 256;   // src/cuda/launch.cuh: every pmoe kernel's block
constexpr int kScanRounds = 9;       // a block scan of 256: log2(256) + 1 barrier rounds
constexpr int kPmoeTileRows = 128;   // grouped_gemm_sm90.cu: 128 x 256 x 64, cooperative
constexpr double kBf16 = 2;

double us_at_hbm(const GpuSpec& gpu, double bytes) { return bytes / (gpu.hbm_gbps.value * 1e3); }

// A kernel around the GEMMs, through the kernel model: a full grid moving `bytes`, or a few
// blocks walking `steps` dependent accesses after `rounds` barrier rounds.
StageKernel around(const GpuSpec& gpu, const std::string& name, double read, double written,
                   unsigned blocks, int rounds = 0, int64_t steps = 0) {
  KernelCounts c;
  c.kernel = name;
  c.launches = 1;
  c.blocks = blocks;
  c.barrier_rounds = uint64_t(rounds);
  c.serial_steps = uint64_t(steps);
  c.total_bytes_read = uint64_t(read);
  c.total_bytes_written = uint64_t(written);
  const KernelPrediction p = predict_kernel(gpu, c, 1);
  return {name, "", read + written, 0, p.total_us};
}

int64_t experts_with_rows(const std::vector<int64_t>& rows) {
  return std::count_if(rows.begin(), rows.end(), [](int64_t r) { return r > 0; });
}

void add(StagePrediction& stage, StageKernel k) {
  stage.us += k.us;
  stage.kernels.push_back(std::move(k));
}

}  // namespace

int64_t ExpertStageShape::rows() const {
  return std::accumulate(group_rows.begin(), group_rows.end(), int64_t(0));
}

const StageKernel* StagePrediction::find(const std::string& kernel) const {
  for (const StageKernel& k : kernels)
    if (k.kernel == kernel) return &k;
  return nullptr;
}

StageKernel predict_grouped_gemm(const GpuSpec& gpu, const std::string& name,
                                 const std::string& what, const GroupedGemm& g) {
  PMOE_CHECK(g.n > 0 && g.k > 0 && g.tile_rows > 0 && (g.out_bytes == 2 || g.out_bytes == 4),
             "predict_grouped_gemm: n, k and tile rows must be positive and D 2 or 4 bytes");
  int64_t used = 0, issued = 0;
  for (int64_t m : g.group_rows) {
    PMOE_CHECK(m >= 0, "predict_grouped_gemm: a group of ", m, " rows");
    used += m;
    issued += (m + g.tile_rows - 1) / g.tile_rows * g.tile_rows;
  }
  StageKernel k;
  k.kernel = name;
  k.what = what;
  k.issued_flops = 2.0 * double(issued) * double(g.n) * double(g.k);
  const double operands = kBf16 * (double(used) * g.k + double(experts_with_rows(g.group_rows)) *
                                                            double(g.k) * double(g.n));
  const double stored = double(used) * double(g.n) * g.out_bytes;
  k.bytes = operands + stored;
  const double mainloop = std::max(k.issued_flops / (gpu.tensor_bf16_tflops.value * 1e6),
                                   us_at_hbm(gpu, operands));
  k.us = gpu.launch_us.value + mainloop + us_at_hbm(gpu, stored);
  return k;
}

StageRowKernelBytes pmoe_row_kernel_bytes(const ExpertStageShape& s, int element_bytes) {
  const double rows = double(s.rows()), E = double(s.group_rows.size());
  StageRowKernelBytes b;
  b.group_pairs_read = rows * 4;                // the indices (then from L2)
  b.group_pairs_written = rows * 8 + E * 4;     // token_of_row, row_of_pair, the counts
  b.gather_read = rows * double(s.feature) * element_bytes;
  b.gather_written = b.gather_read;
  b.activate_read = rows * 2.0 * double(s.ffn) * 4;  // GEMM 1's f32 output, both halves
  b.activate_written = rows * double(s.ffn) * element_bytes;
  return b;
}

ExpertStagePrediction predict_expert_stage(const GpuSpec& gpu, const ExpertStageShape& s) {
  PMOE_CHECK(s.feature > 0 && s.ffn > 0 && s.output > 0 && s.top_k > 0 && !s.group_rows.empty(),
             "predict_expert_stage: widths, top-k and the groups must be given");
  const int64_t rows = s.rows();
  PMOE_CHECK(rows == s.tokens * s.top_k, "predict_expert_stage: the groups hold ", rows,
             " rows where tokens x top-k is ", s.tokens * s.top_k);
  const int E = int(s.group_rows.size());
  const unsigned full_grid = unsigned(2 * gpu.sms.value);
  ExpertStagePrediction p;
  p.pmoe.used_flops = p.torch.used_flops =
      2.0 * double(rows) * (double(s.feature) * 2 * double(s.ffn) + double(s.ffn) * s.output);

  // pmoe: src/cuda/moe/local_moe.cuh's experts phase.
  const StageRowKernelBytes b = pmoe_row_kernel_bytes(s);
  const unsigned pair_blocks = unsigned(std::min<int64_t>(E, full_grid));
  const int64_t experts_a_block = (E + pair_blocks - 1) / pair_blocks;
  const int64_t share = (rows + kBlockThreads - 1) / kBlockThreads;  // pairs a thread walks
  add(p.pmoe, around(gpu, "moe_group_pairs", b.group_pairs_read, b.group_pairs_written,
                     pair_blocks, int(experts_a_block * (kScanRounds + 1)),
                     experts_a_block * 2 * share));
  add(p.pmoe, around(gpu, "moe_gather_rows", b.gather_read, b.gather_written, full_grid));
  add(p.pmoe, around(gpu, "plan_groups", 4.0 * E, 0, 1, kScanRounds, (E + kBlockThreads - 1) /
                                                                          kBlockThreads));
  add(p.pmoe, predict_grouped_gemm(gpu, "library_grouped_gemm", "GEMM 1, f32 out",
                                   {s.group_rows, 2 * s.ffn, s.feature, kPmoeTileRows, 4}));
  add(p.pmoe, around(gpu, "moe_activate", b.activate_read, b.activate_written, full_grid));
  add(p.pmoe, predict_grouped_gemm(gpu, "library_grouped_gemm", "GEMM 2, f32 out",
                                   {s.group_rows, s.output, s.ffn, kPmoeTileRows, 4}));

  // torch: tools/torch_grouped_mm.py's stage.
  const double mean_rows = double(rows) / E;
  auto torch_tile = [&](int64_t n) { return mean_rows > 128 && n > 128 ? 128 : 64; };
  const double half = double(rows) * double(s.ffn) * kBf16;  // one [rows, F] bf16 tensor
  add(p.torch, around(gpu, "prepare_grouped_gemm_data", 4.0 * E, 0, 1));
  add(p.torch, predict_grouped_gemm(gpu, "grouped_mm", "GEMM 1, bf16 out",
                                    {s.group_rows, 2 * s.ffn, s.feature, torch_tile(2 * s.ffn), 2}));
  add(p.torch, around(gpu, "silu", half, half, full_grid));
  add(p.torch, around(gpu, "mul", 2 * half, half, full_grid));
  add(p.torch, around(gpu, "prepare_grouped_gemm_data", 4.0 * E, 0, 1));
  add(p.torch, predict_grouped_gemm(gpu, "grouped_mm", "GEMM 2, bf16 out",
                                    {s.group_rows, s.output, s.ffn, torch_tile(s.output), 2}));
  return p;
}

}  // namespace pmoe::bench
