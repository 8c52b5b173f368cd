// What the MoE layer tests on the CUDA backend share: a case run on W thread ranks of one device
// against the reference, the same case on the device and on the CPU compared, and the base case.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/gemm.hpp"
#include "moe_cases.hpp"
#include "pmoe/comm.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::testing {

// Runs `c` on W thread ranks of `device`; every rank must match the reference. Returns each
// rank's result (its output and stats of the last call).
inline std::vector<MoeCaseResult> expect_case(MoeCase c, int W, Device device) {
  cpu::set_blas_threads(1);  // thread ranks call BLAS at once (the CPU layers and cuBLAS's shim)
  c.device = device;
  std::vector<MoeCaseResult> results(static_cast<size_t>(W));
  run_ranks(
      W, [&](Communicator& comm) { results[size_t(comm.rank())] = run_moe_case(comm, c); }, device);
  int compared = 0;
  for (const MoeCaseResult& r : results) {
    EXPECT_EQ(r.error, "") << describe(c, W);
    compared += r.compared;
  }
  if (c.batch > 0) {
    EXPECT_GT(compared, 0) << describe(c, W);
  }
  return results;
}

// The case on the device, then on the CPU: both match the reference, and each other within the
// dtype's tolerance (relative to the largest output).
inline void expect_device_matches_cpu(const MoeCase& c, int W) {
  const auto device = expect_case(c, W, Device::cuda(0));
  const auto cpu = expect_case(c, W, Device::cpu());
  ASSERT_EQ(device.size(), cpu.size());
  for (size_t r = 0; r < cpu.size(); ++r) {
    const std::vector<float>&on_device = device[r].y, &on_cpu = cpu[r].y;
    ASSERT_EQ(on_device.size(), on_cpu.size()) << describe(c, W);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < on_cpu.size(); ++i) {
      worst = std::max(worst, double(std::abs(on_device[i] - on_cpu[i])));
      scale = std::max(scale, double(std::abs(on_cpu[i])));
    }
    EXPECT_LE(worst, reference::moe_tolerance(c.config.dtype) * scale)
        << describe(c, W) << " rank " << r;
  }
}

inline MoeCase base_case(MoeVariant v, int W, Activation act, DType dtype) {
  MoeCase c;
  // Two experts per rank; ffn divisible by 1..4 for TP; a batch no W > 1 divides.
  c.config =
      make_moe_config(/*feature=*/24, /*ffn=*/36, /*experts=*/2 * W, /*top_k=*/2, act, dtype);
  c.variant = v;
  c.batch = 4 * W + 3;
  return c;
}

}  // namespace pmoe::testing
