// The bytes the MoE layers' row kernels move, counted by the emulated device (which cannot time
// them): SimpleMoe on 1 rank and EpMoe on 2 thread ranks sharing emulated GPU 0, at the
// Mixtral-8x7B (8 experts, top-2) and DeepSeek-V3 (256 experts, top-8) routing with a reduced
// hidden size (H 256, F 128, swiglu), bf16 and f32. Each forward is checked against the plain
// reference, and each row kernel (gather, activate, narrow, widen, the gating sum) must read and
// write at least the bytes of the rows in use and at most 1.1 times them, on a full grid: the
// capacity around those rows (E m slots for m k in use locally, W C an expert for EP) is never
// walked. The expert stage's model (tools/pmoe-bench/expert_stage_model.hpp) charges pmoe's
// kernels the bytes counted here, and knows every kernel of the stage. Emulator only: a GPU counts
// nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/cuda_test_flavor.hpp"
#include "cuda/launch.cuh"
#include "cuda/sm_count.hpp"
#include "expert_stage_model.hpp"
#include "moe_cases.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/diagnostics/kernel_counts.hpp"

namespace pmoe::testing {
namespace {

struct Shape {
  const char* name;
  int experts, top_k, batch;
};
// The presets' experts and top-k; batches small enough for the emulated device.
constexpr Shape kMixtral{"mixtral-8x7b", 8, 2, 64};
constexpr Shape kDeepSeek{"deepseek-v3", 256, 8, 32};
constexpr int kFeature = 256, kFfn = 128;
constexpr double kSlack = 1.1;  // counts (a word a group a block) and nothing else on top

struct Counted {
  std::vector<KernelCounts> kernels;
  MoeCase c;
  int W = 1;
};

Counted run_counted(const Shape& s, MoeVariant variant, DType dtype) {
  Counted out;
  out.W = variant == MoeVariant::ep ? 2 : 1;
  out.c.config = make_moe_config(kFeature, kFfn, s.experts, s.top_k, Activation::swiglu, dtype);
  out.c.variant = variant;
  out.c.batch = s.batch;
  out.c.device = Device::cuda(0);
  std::vector<MoeCaseResult> results(size_t(out.W));
  start_counting_kernels();
  run_ranks(
      out.W, [&](Communicator& comm) { results[size_t(comm.rank())] = run_moe_case(comm, out.c); },
      Device::cuda(0));
  out.kernels = stop_counting_kernels();
  int compared = 0;
  for (const MoeCaseResult& r : results) {
    EXPECT_EQ(r.error, "") << describe(out.c, out.W);
    compared += r.compared;
  }
  EXPECT_GT(compared, 0) << describe(out.c, out.W);
  return out;
}

const KernelCounts* find(const Counted& counted, const std::string& name) {
  for (const KernelCounts& k : counted.kernels)
    if (k.kernel == name) return &k;
  return nullptr;
}

int full_grid() { return cuda::grid_blocks(cuda::sm_count(0)); }

// Kernel `name` read and wrote, over all its launches (every rank's), at least the bytes given
// (the rows in use) and at most kSlack times them, each launch on a full grid.
void expect_bytes(const Counted& counted, const std::string& name, int64_t read, int64_t written,
                  const std::string& where) {
  const KernelCounts* k = find(counted, name);
  ASSERT_NE(k, nullptr) << where << ": " << name << " did not run";
  EXPECT_GE(k->total_bytes_read, read) << where << " " << name;
  EXPECT_LE(double(k->total_bytes_read), kSlack * double(read)) << where << " " << name;
  EXPECT_GE(k->total_bytes_written, written) << where << " " << name;
  EXPECT_LE(double(k->total_bytes_written), kSlack * double(written)) << where << " " << name;
  EXPECT_EQ(int(k->blocks), full_grid()) << where << " " << name;
  std::printf("%-40s %-18s %4d launches: read %10lld B (rows in use %10lld), written %10lld B "
              "(%10lld)\n",
              where.c_str(), name.c_str(), k->launches, (long long)k->total_bytes_read,
              (long long)read, (long long)k->total_bytes_written, (long long)written);
}

void expect_live_rows_only(const Shape& s, MoeVariant variant, DType dtype) {
  if (!kOnEmulatedDevice) GTEST_SKIP() << "a GPU counts nothing";
  const Counted counted = run_counted(s, variant, dtype);
  ASSERT_FALSE(counted.kernels.empty()) << "the emulated device counted no kernel";
  const MoeConfig& c = counted.c.config;
  const std::string where = std::string(s.name) + " " + variant_name(variant) + " " +
                            std::string(dtype_name(dtype));
  // Every token picks top_k distinct experts: m k rows in use over all ranks.
  const int64_t rows = int64_t(s.batch) * s.top_k, elem = int64_t(dtype_size(dtype));
  const int64_t H = c.hidden_dim, F = c.ffn_dim, O = c.out_dim(), f32 = sizeof(float);
  // swiglu: gate and linear halves read in f32, the product written in the layer's dtype.
  expect_bytes(counted, "moe_activate", rows * 2 * F * f32, rows * F * elem, where);
  if (variant == MoeVariant::simple) {
    expect_bytes(counted, "moe_gather_rows", rows * H * elem, rows * H * elem, where);
    expect_bytes(counted, "moe_weighted_sum", rows * O * f32, int64_t(s.batch) * O * elem, where);
  } else {
    expect_bytes(counted, "moe_narrow_rows", rows * O * f32, rows * O * elem, where);
  }
  if (dtype != DType::f32)  // the router's input, every token's row
    expect_bytes(counted, "moe_widen_rows", int64_t(s.batch) * H * elem,
                 int64_t(s.batch) * H * f32, where);
}

TEST(MoeCudaBytes, SimpleMixtralTouchesLiveRowsOnly) {
  expect_live_rows_only(kMixtral, MoeVariant::simple, DType::bf16);
  expect_live_rows_only(kMixtral, MoeVariant::simple, DType::f32);
}
TEST(MoeCudaBytes, SimpleDeepSeekTouchesLiveRowsOnly) {
  expect_live_rows_only(kDeepSeek, MoeVariant::simple, DType::bf16);
  expect_live_rows_only(kDeepSeek, MoeVariant::simple, DType::f32);
}
TEST(MoeCudaBytes, EpMixtralTouchesLiveRowsOnly) {
  expect_live_rows_only(kMixtral, MoeVariant::ep, DType::bf16);
}
TEST(MoeCudaBytes, EpDeepSeekTouchesLiveRowsOnly) {
  expect_live_rows_only(kDeepSeek, MoeVariant::ep, DType::bf16);
}

// The expert stage's model charges the kernels around the GEMMs what the emulated device counts
// (group_pairs' stores exactly; gather and activate within the same slack as above), and every
// kernel a SimpleMoe forward launches is either one of the model's stage or outside the stage
// (the router before it, the gating sum after it): a kernel added to the stage and not to the
// model fails here.
void expect_model_charges_counted_bytes(const Shape& s) {
  if (!kOnEmulatedDevice) GTEST_SKIP() << "a GPU counts nothing";
  const Counted counted = run_counted(s, MoeVariant::simple, DType::bf16);
  const MoeConfig& c = counted.c.config;
  bench::ExpertStageShape shape;
  shape.feature = c.hidden_dim;
  shape.ffn = c.ffn_dim;
  shape.output = c.out_dim();
  shape.tokens = s.batch;
  shape.top_k = s.top_k;
  // The bytes depend on the rows and the experts, not on how the rows split.
  const int64_t rows = int64_t(s.batch) * s.top_k;
  for (int e = 0; e < s.experts; ++e)
    shape.group_rows.push_back(rows / s.experts + (e < rows % s.experts ? 1 : 0));
  const bench::StageRowKernelBytes b = bench::pmoe_row_kernel_bytes(shape, 2);
  const std::string where = std::string(s.name) + " simple bf16, the model's bytes";
  const KernelCounts* pairs = find(counted, "moe_group_pairs");
  ASSERT_NE(pairs, nullptr) << where;
  EXPECT_EQ(double(pairs->total_bytes_written), b.group_pairs_written) << where;
  expect_bytes(counted, "moe_gather_rows", int64_t(b.gather_read), int64_t(b.gather_written), where);
  expect_bytes(counted, "moe_activate", int64_t(b.activate_read), int64_t(b.activate_written),
               where);

  const bench::ExpertStagePrediction p =
      bench::predict_expert_stage(bench::find_gpu("h200"), shape);
  const std::vector<std::string> outside = {"moe_widen_rows", "moe_top_k_softmax",
                                            "moe_weighted_sum"};
  std::printf("%s: kernels of a forward:", where.c_str());
  for (const KernelCounts& k : counted.kernels) std::printf(" %s", k.kernel.c_str());
  std::printf("\n");
  for (const KernelCounts& k : counted.kernels) {
    const bool in_stage = p.pmoe.find(k.kernel) != nullptr;
    const bool around = std::find(outside.begin(), outside.end(), k.kernel) != outside.end();
    EXPECT_TRUE(in_stage || around) << where << ": " << k.kernel
                                    << " ran and the expert stage's model does not know it";
  }
  for (const bench::StageKernel& k : p.pmoe.kernels)
    EXPECT_NE(find(counted, k.kernel), nullptr) << where << ": the model charges " << k.kernel
                                                << ", which did not run";
}

TEST(MoeCudaBytes, TheExpertStageModelChargesTheCountedBytesMixtral) {
  expect_model_charges_counted_bytes(kMixtral);
}
TEST(MoeCudaBytes, TheExpertStageModelChargesTheCountedBytesDeepSeek) {
  expect_model_charges_counted_bytes(kDeepSeek);
}

}  // namespace
}  // namespace pmoe::testing
