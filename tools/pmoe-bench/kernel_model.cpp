#include "kernel_model.hpp"

#include <algorithm>
#include <cmath>

#include "pmoe/error.hpp"

namespace pmoe::bench {
namespace {

// Figures both Hopper SXM parts share (one GH100 die): only the memory differs.
constexpr const char* kSmsSource =
    "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 132 SMs on the SXM5 board; "
    "the H200 SXM is the same GH100 configuration (NVIDIA H200 datasheet)";
constexpr const char* kClockSource =
    "1980 MHz, the SXM5 boards' maximum SM clock (nvidia-smi clocks.max.sm; NVIDIA H100 "
    "datasheet's boost clock); under load a board may run lower";
constexpr const char* kL2Source =
    "Table 3 of Ultrasonics Sonochemistry 99 (2023) 106546 (pmc.ncbi.nlm.nih.gov/articles/"
    "PMC10448217): L2 latency 200 cycles, global memory 400, shared memory 20 on H100; Jia et "
    "al., 'Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking' (2018), measured "
    "193 cycles for an L2 hit on V100";
constexpr const char* kBarrierSource =
    "assumed: one shared-memory latency (20 cycles, the same table) for a barrier whose warps "
    "arrive together; Wong et al., 'Demystifying GPU Microarchitecture through "
    "Microbenchmarking' (ISPASS 2010) measured __syncthreads() at about 20 cycles for one warp";
constexpr const char* kLaunchSource =
    "assumed, from the scale NVIDIA's 'Getting Started with CUDA Graphs' (developer.nvidia.com/"
    "blog/cuda-graphs, 2019) gives for a short kernel's launch overhead (a few µs, on V100): "
    "2 µs of a kernel's start and drain on the GPU, not re-measured on Hopper";
constexpr const char* kHostLaunchSource =
    "assumed, the same post: the host's cost of one launch (cudaLaunchKernel and the op's own "
    "host code), which a graph replay does not pay";
constexpr const char* kFenceSource =
    "assumed: a fence of system scope waits until the SM's earlier writes are visible beyond "
    "the GPU, about one NVLink/PCIe round trip (~1 µs); no Hopper measurement found";
constexpr const char* kPeerWaitSource =
    "two global-memory latencies (400 cycles each, the table above): the peer's flag store "
    "reaches L2 and the waiting block's next poll reads it (ranks on one GPU)";
constexpr const char* kNvlinkSource =
    "NVIDIA H100 / H200 datasheets: NVLink 900 GB/s bidirectional, 450 GB/s a direction; not "
    "used while the ranks share one GPU (every measurement so far)";
constexpr const char* kTensorSource =
    "NVIDIA H100 and H200 Tensor Core GPU datasheets (SXM): BF16 tensor 1,979 TFLOPS with "
    "sparsity, so 989 dense; the same GH100 tensor cores in both";

GpuSpec hopper(std::string name, std::string description, double hbm_gbps, const char* hbm_source) {
  GpuSpec g;
  g.name = std::move(name);
  g.description = std::move(description);
  g.sms = {132, "SMs", kSmsSource};
  g.clock_ghz = {1.98, "GHz", kClockSource};
  g.hbm_gbps = {hbm_gbps, "GB/s", hbm_source};
  g.l2_latency_cycles = {200, "cycles", kL2Source};
  g.barrier_cycles = {20, "cycles", kBarrierSource};
  g.launch_us = {2.0, "µs", kLaunchSource};
  g.host_launch_us = {2.5, "µs", kHostLaunchSource};
  g.system_fence_us = {1.0, "µs", kFenceSource};
  g.peer_wait_us = {2 * 400 / 1.98e3, "µs", kPeerWaitSource};
  g.nvlink_gbps = {450, "GB/s", kNvlinkSource};
  g.tensor_bf16_tflops = {989, "TFLOP/s", kTensorSource};
  return g;
}

const std::vector<GpuSpec>& presets() {
  static const std::vector<GpuSpec> all = {
      hopper("h100-sxm", "NVIDIA H100 SXM5 (80 GB HBM3)", 3350,
             "NVIDIA H100 Tensor Core GPU datasheet: 3.35 TB/s HBM3 (SXM)"),
      hopper("h200", "NVIDIA H200 SXM (141 GB HBM3e)", 4800,
             "NVIDIA H200 Tensor Core GPU datasheet: 4.8 TB/s HBM3e"),
  };
  return all;
}

}  // namespace

std::vector<std::string> gpu_names() {
  std::vector<std::string> names;
  for (const GpuSpec& g : presets()) names.push_back(g.name);
  return names;
}

const GpuSpec& find_gpu(const std::string& name) {
  std::string known;
  for (const GpuSpec& g : presets()) {
    if (g.name == name) return g;
    known += (known.empty() ? "" : ", ") + g.name;
  }
  PMOE_CHECK(false, "--gpu: no GPU named '", name, "' in the kernel model; known: ", known);
  return presets().front();  // not reached
}

KernelPrediction predict_kernel(const GpuSpec& gpu, const KernelCounts& c, int ranks, int calls) {
  PMOE_CHECK(ranks >= 1 && calls >= 1, "predict_kernel: ranks and calls must be >= 1, got ", ranks,
             " and ", calls);
  KernelPrediction p;
  p.kernel = c.kernel;
  const double per_rank_launches = double(c.launches) / ranks;  // over all calls
  p.launches_per_call = per_rank_launches / calls;
  if (c.launches == 0) return p;
  const double cycle_us = 1e-3 / gpu.clock_ghz.value;
  const double l2_us = gpu.l2_latency_cycles.value * cycle_us;
  const double resident = 2.0 * gpu.sms.value;  // blocks at once: src/cuda/launch.cuh's rule
  p.waves = std::max(1, int(std::ceil(double(ranks) * std::max(1u, c.blocks) / resident)));
  // One launch's parts. Bytes: every rank's launches of this kernel move total_bytes over the
  // calls; one launch of each rank at once moves total / per_rank_launches of them.
  p.launch_us = gpu.launch_us.value;
  p.rounds_us = p.waves * c.barrier_rounds * (gpu.barrier_cycles.value * cycle_us + l2_us);
  p.steps_us = p.waves * double(c.serial_steps) * l2_us;
  const double bytes = double(c.total_bytes_read + c.total_bytes_written) / per_rank_launches;
  p.bytes_us = bytes / (gpu.hbm_gbps.value * 1e3);  // GB/s = 1e3 bytes per µs
  p.fences_us =
      std::ceil(double(c.system_fences) / std::max(1u, c.blocks)) * gpu.system_fence_us.value;
  p.wait_us = c.blocks_that_spun > 0 ? gpu.peer_wait_us.value : 0.0;
  const double one = p.launch_us + p.rounds_us + p.steps_us + p.bytes_us + p.fences_us + p.wait_us;
  p.launch_us *= p.launches_per_call;
  p.rounds_us *= p.launches_per_call;
  p.steps_us *= p.launches_per_call;
  p.bytes_us *= p.launches_per_call;
  p.fences_us *= p.launches_per_call;
  p.wait_us *= p.launches_per_call;
  p.total_us = one * p.launches_per_call;
  return p;
}

OpPrediction predict_op(const GpuSpec& gpu, const std::vector<KernelCounts>& counts, int ranks,
                        int calls) {
  OpPrediction op;
  for (const KernelCounts& c : counts) {
    op.kernels.push_back(predict_kernel(gpu, c, ranks, calls));
    op.kernel_us += op.kernels.back().total_us;
    op.launches_per_call += op.kernels.back().launches_per_call;
  }
  // The ranks' host threads launch in turn (one CUDA context), so the last rank's kernels start
  // after every rank's launches.
  op.host_us = op.kernel_us + ranks * op.launches_per_call * gpu.host_launch_us.value;
  return op;
}

double copy_us(const GpuSpec& gpu, double bytes) {
  return gpu.launch_us.value + 2 * bytes / (gpu.hbm_gbps.value * 1e3);
}

}  // namespace pmoe::bench
