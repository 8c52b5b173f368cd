// The kernel model: each kernel's counts from the emulated device (include/pmoe/diagnostics/kernel_counts.hpp)
// turned into µs on a named GPU, from that GPU's published figures, none fitted to a pmoe kernel.
// The link model (model_links.hpp) prices what crosses links between ranks; this one prices what
// one GPU does inside a kernel. docs/gpu-all-to-all.md ("Predicted against measured") holds it
// against every GPU measurement the project has.
//
// One launch of a kernel, on the GPU its W ranks share (each rank launches its own grid):
//
//   t = launch
//     + waves x (barrier_rounds x (barrier + L2 latency) + serial_steps x L2 latency)
//     + W x (bytes read + written in one launch) / HBM bandwidth
//     + (system fences of one launch / its blocks) x system fence
//     + (a block waited on a peer or its grid ? peer wait : 0)
//
//   waves  = ceil(W x grid / (2 x SMs)): the slowest block's path runs once per wave of resident
//            blocks (2 a SM, the grid rule of src/cuda/launch.cuh), so W ranks' grids sharing one
//            GPU take turns, and blocks that spin on their own grid keep the next wave out.
//   rounds = a __syncthreads() whose round exchanges data through shared memory or L2: one
//            barrier and one L2 round trip (the tables and flags a round reads are L2-resident).
//   steps  = one thread's iterations of the loops that grow with tokens, experts or ranks: each
//            charged one L2 round trip, the latency of a dependent access; a copy's 16-byte
//            words are cheaper than that, so copies are over-charged here (their bytes are also
//            charged at HBM bandwidth, below).
//   bytes  = what every rank's launch moves, at the GPU's HBM bandwidth (the ranks' grids run
//            at once and share it).
//
// An op is its kernels in stream order (dependent launches: each kernel's time adds). The host
// side, for times taken with events recorded before the host's launches (bench rows before graph
// replay, and every measurement of the f564735 run on the H200): + host_launch per launch of each
// rank, the ranks' host threads launching in turn.
#pragma once

#include <string>
#include <vector>

#include "pmoe/diagnostics/kernel_counts.hpp"

namespace pmoe::bench {

// A GPU's figures, each with where it comes from.
struct GpuFigure {
  double value = 0;
  const char* unit = "";
  const char* source = "";
};
struct GpuSpec {
  std::string name;         // the --gpu name: "h100-sxm", "h200"
  std::string description;  // e.g. "NVIDIA H200 SXM (141 GB HBM3e)"
  GpuFigure sms, clock_ghz, hbm_gbps, l2_latency_cycles, barrier_cycles, launch_us, host_launch_us,
      system_fence_us, peer_wait_us, nvlink_gbps;
  GpuFigure tensor_bf16_tflops;  // dense: the expert stage's GEMMs (expert_stage_model.hpp)
};

// The presets: "h100-sxm" and "h200". Throws pmoe::Error naming the known ones otherwise.
const GpuSpec& find_gpu(const std::string& name);
std::vector<std::string> gpu_names();

// One kernel's predicted time on one call of its op, from counts taken over `calls` calls of the
// op on each of `ranks` ranks sharing one GPU (KernelCounts::launches counts every rank's).
struct KernelPrediction {
  std::string kernel;
  double launches_per_call = 0;  // of one rank
  int waves = 0;
  double launch_us = 0, rounds_us = 0, steps_us = 0, bytes_us = 0, fences_us = 0, wait_us = 0;
  double total_us = 0;  // launches_per_call x (one launch's parts, summed)
};
KernelPrediction predict_kernel(const GpuSpec& gpu, const KernelCounts& counts, int ranks,
                                int calls = 1);

// An op (dispatch or combine): its kernels in order. kernel_us is what events around a graph
// replay see; host_us adds the host's launches, as events recorded before them see.
struct OpPrediction {
  std::vector<KernelPrediction> kernels;
  double kernel_us = 0, host_us = 0;
  double launches_per_call = 0;  // of one rank, all kernels
};
OpPrediction predict_op(const GpuSpec& gpu, const std::vector<KernelCounts>& counts, int ranks,
                        int calls = 1);

// A device-to-device copy of `bytes` (each read once and written once): one launch and 2 x bytes
// at HBM bandwidth. The numerator of "fraction of a copy" (copy time over the op's).
double copy_us(const GpuSpec& gpu, double bytes);

}  // namespace pmoe::bench
