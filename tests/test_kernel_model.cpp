// Host only, no ranks run: the kernel model (tools/pmoe-bench/kernel_model.hpp) on hand-made
// counts, worked out by hand for one rank and for 8 ranks sharing the GPU: each term alone
// (launch, rounds, steps, bytes, fences, a wait), waves when grids outgrow the GPU, launches
// spread over ranks and calls, an op's host time, a copy, and unknown GPUs named.
#include <gtest/gtest.h>

#include "kernel_model.hpp"
#include "pmoe/error.hpp"

namespace pmoe::bench {
namespace {

// H200: 1.98 GHz, so one cycle is 1 / 1980 µs; L2 latency 200 cycles, barrier 20.
constexpr double kCycleUs = 1.0 / 1980.0;
constexpr double kL2Us = 200 * kCycleUs;

KernelCounts counts(const char* name, int launches, unsigned blocks) {
  KernelCounts c;
  c.kernel = name;
  c.launches = launches;
  c.blocks = blocks;
  return c;
}

TEST(KernelModel, AnEmptyKernelCostsItsLaunch) {
  const GpuSpec& h200 = find_gpu("h200");
  const KernelPrediction p = predict_kernel(h200, counts("k", 1, 1), 1);
  EXPECT_DOUBLE_EQ(p.launches_per_call, 1.0);
  EXPECT_EQ(p.waves, 1);
  EXPECT_DOUBLE_EQ(p.total_us, 2.0);
  EXPECT_DOUBLE_EQ(p.rounds_us + p.steps_us + p.bytes_us + p.fences_us + p.wait_us, 0.0);
}

TEST(KernelModel, EachTermByHand) {
  const GpuSpec& h200 = find_gpu("h200");
  KernelCounts c = counts("k", 1, 264);
  c.barrier_rounds = 10;
  c.serial_steps = 100;
  c.total_bytes_read = 3'000'000;  // 4.8 MB in all at 4.8 TB/s: 1 µs
  c.total_bytes_written = 1'800'000;
  c.system_fences = 264;   // one a block: one fence on the path, 1 µs
  c.blocks_that_spun = 1;  // a peer wait: 2 x 400 cycles
  const KernelPrediction p = predict_kernel(h200, c, 1);
  EXPECT_EQ(p.waves, 1);  // 264 blocks fill 132 SMs at 2 each
  EXPECT_NEAR(p.rounds_us, 10 * (20 * kCycleUs + kL2Us), 1e-12);
  EXPECT_NEAR(p.steps_us, 100 * kL2Us, 1e-12);
  EXPECT_NEAR(p.bytes_us, 1.0, 1e-12);
  EXPECT_NEAR(p.fences_us, 1.0, 1e-12);
  EXPECT_NEAR(p.wait_us, 800 * kCycleUs, 1e-12);
  EXPECT_NEAR(p.total_us, 2.0 + 10 * 220 * kCycleUs + 100 * kL2Us + 1.0 + 1.0 + 800 * kCycleUs,
              1e-12);
  // The H100 differs only in its HBM: 3.35 TB/s.
  EXPECT_NEAR(predict_kernel(find_gpu("h100-sxm"), c, 1).bytes_us, 4.8e6 / 3.35e6, 1e-12);
}

TEST(KernelModel, RanksSharingTheGpuTakeTurnsAndShareItsBandwidth) {
  const GpuSpec& h200 = find_gpu("h200");
  // 8 ranks, 3 calls each, one launch a call: 24 launches of a 264-block grid.
  KernelCounts c = counts("k", 24, 264);
  c.serial_steps = 10;
  c.total_bytes_read = 24 * 480'000;  // each rank's launch reads 0.48 MB
  const KernelPrediction p = predict_kernel(h200, c, 8, 3);
  EXPECT_DOUBLE_EQ(p.launches_per_call, 1.0);
  EXPECT_EQ(p.waves, 8);  // 8 x 264 blocks, 264 at a time
  EXPECT_NEAR(p.steps_us, 8 * 10 * kL2Us, 1e-12);
  EXPECT_NEAR(p.bytes_us, 8 * 0.48e6 / 4.8e6, 1e-12);  // the 8 launches at once: 0.8 µs
  // A one-block kernel of 8 ranks fits one wave.
  EXPECT_EQ(predict_kernel(h200, counts("one", 8, 1), 8).waves, 1);
  // Fences: 10 in a launch of 4 blocks: 3 on the slowest block's path.
  KernelCounts f = counts("f", 1, 4);
  f.system_fences = 10;
  EXPECT_NEAR(predict_kernel(h200, f, 1).fences_us, 3.0, 1e-12);
}

TEST(KernelModel, AnOpAddsItsKernelsAndTheHostAddsItsLaunches) {
  const GpuSpec& h200 = find_gpu("h200");
  // Two ranks, one call each: kernel a launched twice a call, b once.
  const std::vector<KernelCounts> op_counts = {counts("a", 4, 1), counts("b", 2, 1)};
  const OpPrediction op = predict_op(h200, op_counts, 2);
  ASSERT_EQ(op.kernels.size(), 2u);
  EXPECT_DOUBLE_EQ(op.kernels[0].launches_per_call, 2.0);
  EXPECT_DOUBLE_EQ(op.kernels[0].total_us, 4.0);
  EXPECT_DOUBLE_EQ(op.kernel_us, 6.0);
  EXPECT_DOUBLE_EQ(op.launches_per_call, 3.0);
  EXPECT_DOUBLE_EQ(op.host_us, 6.0 + 2 * 3 * 2.5);
}

TEST(KernelModel, ACopyAndTheNames) {
  const GpuSpec& h200 = find_gpu("h200");
  EXPECT_NEAR(copy_us(h200, 4.8e6), 2.0 + 2.0, 1e-12);  // read 4.8 MB, write 4.8 MB
  EXPECT_EQ(gpu_names(), (std::vector<std::string>{"h100-sxm", "h200"}));
  for (const std::string& name : gpu_names()) {
    const GpuSpec& g = find_gpu(name);
    for (const GpuFigure* f :
         {&g.sms, &g.clock_ghz, &g.hbm_gbps, &g.l2_latency_cycles, &g.barrier_cycles, &g.launch_us,
          &g.host_launch_us, &g.system_fence_us, &g.peer_wait_us, &g.nvlink_gbps,
          &g.tensor_bf16_tflops}) {
      EXPECT_GT(f->value, 0) << name;
      EXPECT_GT(std::string(f->source).size(), 20u) << name << ": every figure says its source";
    }
  }
  try {
    find_gpu("h100");
    FAIL() << "an unknown GPU was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h100-sxm, h200"), std::string::npos) << e.what();
  }
  EXPECT_THROW(predict_kernel(h200, counts("k", 1, 1), 0), Error);
}

}  // namespace
}  // namespace pmoe::bench
