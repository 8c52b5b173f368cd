// The MoE layers with ranks as MPI processes (ctest runs it under mpiexec -n 4), against the same
// reference and cases as the thread tests. Run twice by ctest: with node-local shared memory, and
// with PMOE_MPI_SHM=0, where every peer is reached through the MPI message transport.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <vector>

#include "moe_cases.hpp"
#include "pmoe/mpi_communicator.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::testing {
namespace {

constexpr Activation kActivations[] = {Activation::relu, Activation::gelu, Activation::swiglu};

int world_size() {
  int W = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &W);
  return W;
}

// Runs `c` on all processes; each checks its own rows. Returns this rank's output.
std::vector<float> expect_case(const MoeCase& c) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const MoeCaseResult result = run_moe_case(comm, c);
  EXPECT_EQ(result.error, "");
  EXPECT_LE(result.skipped * 10, result.compared + result.skipped) << describe(c, comm.size());
  return result.y;
}

MoeCase base_case(MoeVariant v, Activation act, DType dtype) {
  const int W = world_size();
  MoeCase c;
  c.config = make_moe_config(24, 32, 2 * W, 2, act, dtype);  // two experts per rank
  c.variant = v;
  c.batch = 4 * W + 3;  // not divisible by W
  return c;
}

TEST(MoeMpi, EveryVariantActivationAndDtype) {
  for (MoeVariant v : {MoeVariant::simple, MoeVariant::tp, MoeVariant::ep})
    for (Activation act : kActivations)
      for (DType dtype : {DType::f32, DType::bf16}) expect_case(base_case(v, act, dtype));
}

TEST(MoeMpi, EpMicroBatchesAgree) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    MoeCase c = base_case(MoeVariant::ep, Activation::swiglu, dtype);
    const std::vector<float> one = expect_case(c);
    c.micro_batches = 2;
    const std::vector<float> two = expect_case(c);
    ASSERT_EQ(one.size(), two.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < one.size(); ++i) {
      worst = std::max(worst, double(std::abs(one[i] - two[i])));
      scale = std::max(scale, double(std::abs(one[i])));
    }
    EXPECT_LE(worst, reference::moe_tolerance(dtype) * scale);
  }
}

TEST(MoeMpi, SeedShapeTopKEqualsEAndSmallBatches) {
  for (MoeVariant v : {MoeVariant::simple, MoeVariant::tp, MoeVariant::ep}) {
    MoeCase seed_shape;
    seed_shape.config = make_moe_config(32, 128, 4, 2, Activation::relu, DType::f32, 64);
    seed_shape.variant = v;
    seed_shape.batch = 13;
    expect_case(seed_shape);
    MoeCase all_experts = base_case(v, Activation::gelu, DType::f32);
    all_experts.config.top_k = all_experts.config.num_experts;
    expect_case(all_experts);
    MoeCase small = base_case(v, Activation::relu, DType::bf16);
    small.batch = 2;  // fewer tokens than ranks, then 1, then 0
    small.calls = 3;
    expect_case(small);
  }
}

TEST(MoeMpi, ManyCallsOnOneLayer) {
  for (MoeVariant v : {MoeVariant::tp, MoeVariant::ep})
    for (int mb : {1, 2}) {
      if (v == MoeVariant::tp && mb == 2) continue;
      MoeCase c = base_case(v, Activation::relu, DType::f32);
      c.micro_batches = mb;
      c.calls = 20;
      expect_case(c);
    }
}

}  // namespace
}  // namespace pmoe::testing
