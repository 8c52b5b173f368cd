// AllGatherGemm and GemmReduceScatter on one CUDA device shared by W thread ranks (W in {1, 2, 3,
// 4}), each with its own stream, GEMMs through cuBLAS (on the emulated device, the host-BLAS
// shim), against the same plain reference and cases as the CPU tests (tests/test_overlap.cpp):
// both orders, f32, bf16 and f16, uneven pieces, every entry point, many calls that reuse the
// buffers. Built for the emulated device and for a GPU (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/cuda_test_flavor.hpp"
#include "overlap_cases.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "reference/overlap_reference.hpp"

namespace pmoe::testing {
namespace {

OverlapResult expect_case_on_device(int W, OverlapCase c) {
  c.device = Device::cuda(0);
  std::vector<OverlapResult> results(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) { results[size_t(comm.rank())] = run_overlap_case(comm, c); },
            Device::cuda(0));
  for (int r = 0; r < W; ++r) EXPECT_EQ(results[size_t(r)].error, "") << "W = " << W;
  return results[0];
}

class OverlapCuda : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { PMOE_REQUIRE_CUDA_RUNTIME(); }
};

// M = 60, N = 84, K = 108: M/W = 60, 30, 20, 15 rows (AllGatherGemm) or N = 84 columns
// (GemmReduceScatter) into 1, 2, 3 or 5 pieces (uneven for 15 / 2, 20 / 3, 84 / 5), f32 and bf16,
// both orders, the mixed entry points (run, run_serial, the serial steps apart); f16 with 3
// pieces a rank, as the CPU tests.
void sweep(int W, OverlapKind kind) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (OverlapOrder order : {OverlapOrder::all_pairs, OverlapOrder::ring})
      for (int per_rank : {1, 2, 3, 5}) {
        if (dtype == DType::f16 && per_rank != 3) continue;
        OverlapCase c;
        c.kind = kind;
        c.config = make_overlap_config(60, 84, 108, dtype, per_rank * W, order);
        const OverlapResult r = expect_case_on_device(W, c);
        EXPECT_EQ(r.overlaps, W > 1) << describe(c);
      }
}

TEST_P(OverlapCuda, AllGatherGemmMatchesAllGatherThenGemm) {
  sweep(GetParam(), OverlapKind::all_gather_gemm);
}

TEST_P(OverlapCuda, GemmReduceScatterMatchesGemmThenReduceScatter) {
  sweep(GetParam(), OverlapKind::gemm_reduce_scatter);
}

// 36 pieces: one row each (AllGatherGemm), 36 / W columns each (GemmReduceScatter).
TEST_P(OverlapCuda, DefaultChunksAndOneRowPieces) {
  for (OverlapKind kind : {OverlapKind::all_gather_gemm, OverlapKind::gemm_reduce_scatter})
    for (int chunks : {0, 36}) {
      OverlapCase c;
      c.kind = kind;
      c.config = make_overlap_config(36, 60, 84, DType::bf16, chunks, OverlapOrder::ring);
      expect_case_on_device(GetParam(), c);
    }
}

// No barrier between calls: the done words alone keep a rank from overwriting what a peer reads.
TEST_P(OverlapCuda, ManyCallsReuseTheBuffers) {
  const int W = GetParam();
  for (OverlapKind kind : {OverlapKind::all_gather_gemm, OverlapKind::gemm_reduce_scatter})
    for (OverlapOrder order : {OverlapOrder::all_pairs, OverlapOrder::ring})
      for (CallMix mix : {CallMix::overlapped, CallMix::mixed}) {
        OverlapCase c;
        c.kind = kind;
        c.config = make_overlap_config(24, 12, 36, DType::f32, 2 * W, order);
        c.calls = 20;
        c.mix = mix;
        expect_case_on_device(W, c);
      }
}

// run() captured once in a CUDA graph on each rank's stream (the copy stream joins the capture
// through the fork event and is joined back by the join event), then replayed with new inputs
// in the same buffers: every replay matches the reference, and so does a plain run() after the
// replays (the call counter lives on the device, so replays and calls number alike).
void expect_captured_run_replays(int W, OverlapKind kind, OverlapOrder order) {
  const bool gather = kind == OverlapKind::all_gather_gemm;
  const OverlapConfig cfg = make_overlap_config(24, 36, 36, DType::bf16, 2 * W, order);
  std::vector<std::string> errors(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) {
    const int rank = comm.rank();
    std::string& error = errors[size_t(rank)];
    auto expect_cuda = [&](cudaError_t status, const char* what) {
      if (status != cudaSuccess && error.empty())
        error = detail::cat(what, ": ", cudaGetErrorString(status));
    };
    const cudaStream_t stream = static_cast<cudaStream_t>(comm.stream().handle);
    auto inputs_for = [&](int r, uint64_t seed) {
      return gather ? reference::make_all_gather_gemm_inputs(cfg, W, r, seed)
                    : reference::make_gemm_reduce_scatter_inputs(cfg, W, r, seed);
    };
    reference::OverlapInputs first = inputs_for(rank, 100);
    Buffer A = Buffer::like(first.A, comm.device()), B = Buffer::like(first.B, comm.device());
    Buffer C = gather ? Buffer(cfg.dtype, {cfg.m, cfg.n / W})
                      : Buffer(cfg.dtype, {cfg.m / W, cfg.n});
    Buffer device_C = Buffer::like(C, comm.device());
    std::unique_ptr<AllGatherGemm> ag;
    std::unique_ptr<GemmReduceScatter> rs;
    if (gather) ag = std::make_unique<AllGatherGemm>(comm, cfg, comm.device());
    else rs = std::make_unique<GemmReduceScatter>(comm, cfg, comm.device());
    auto run = [&] { gather ? ag->run(A, B, device_C) : rs->run(A, B, device_C); };

    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    expect_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
    try {
      run();
    } catch (const Error& e) {
      error = e.what();
    }
    expect_cuda(cudaStreamEndCapture(stream, &graph), "end capture");
    if (graph) expect_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    // Every rank makes every call, even after a failure: peers would wait for it otherwise.
    for (int call = 0; call < 4; ++call) {
      const uint64_t seed = 200 + uint64_t(call);
      std::vector<Tensor> a_parts, b_parts;
      std::vector<reference::OverlapInputs> all;
      for (int r = 0; r < W; ++r) all.push_back(inputs_for(r, seed));
      for (const auto& in : all) {
        a_parts.push_back(in.A);
        b_parts.push_back(in.B);
      }
      const auto& mine = all[size_t(rank)];
      auto upload = [&](const Buffer& to, const Buffer& from) {
        return cudaMemcpyAsync(to.data<void>(), from.data<void>(), to.nbytes(),
                               cudaMemcpyHostToDevice, stream);
      };
      expect_cuda(upload(A, mine.A), "upload A");
      expect_cuda(upload(B, mine.B), "upload B");
      expect_cuda(cudaMemsetAsync(device_C.data<void>(), 0xFF, device_C.nbytes(), stream),
                  "poison C");
      if (call < 3 && exec) {
        expect_cuda(cudaGraphLaunch(exec, stream), "launch");
      } else {
        run();  // after the replays, a plain call
      }
      expect_cuda(cudaMemcpyAsync(C.data<void>(), device_C.data<void>(), C.nbytes(),
                                  cudaMemcpyDeviceToHost, stream),
                  "download C");
      expect_cuda(cudaStreamSynchronize(stream), "synchronize");
      const reference::Expected want =
          gather ? reference::all_gather_gemm_reference(a_parts, mine.B, cfg.dtype)
                 : reference::gemm_reduce_scatter_reference(a_parts, b_parts, rank, cfg.dtype);
      const std::string diff =
          reference::compare_close(
              detail::cat(call < 3 ? "replay " : "call ", call, " rank ", rank), C, want);
      if (error.empty()) error = diff;
    }
    if (exec) expect_cuda(cudaGraphExecDestroy(exec), "destroy exec");
    if (graph) expect_cuda(cudaGraphDestroy(graph), "destroy graph");
    comm.barrier();
  }, Device::cuda(0));
  for (int r = 0; r < W; ++r)
    EXPECT_EQ(errors[size_t(r)], "") << (gather ? "AllGatherGemm " : "GemmReduceScatter ")
                                     << order_name(order) << " W = " << W;
}

TEST_P(OverlapCuda, CapturedRunReplaysWithNewInputs) {
  for (OverlapKind kind : {OverlapKind::all_gather_gemm, OverlapKind::gemm_reduce_scatter})
    for (OverlapOrder order : {OverlapOrder::all_pairs, OverlapOrder::ring})
      expect_captured_run_replays(GetParam(), kind, order);
}

// PMOE_OVERLAP_COPY=kernel: the pieces copied by a kernel on a few blocks instead of the copy
// engines; both ops, both orders, even and uneven pieces, every entry point, and a capture.
TEST_P(OverlapCuda, CopyKernelsInsteadOfCopyEngines) {
  const int W = GetParam();
  setenv("PMOE_OVERLAP_COPY", "kernel", 1);
  for (OverlapKind kind : {OverlapKind::all_gather_gemm, OverlapKind::gemm_reduce_scatter})
    for (OverlapOrder order : {OverlapOrder::all_pairs, OverlapOrder::ring})
      for (int per_rank : {1, 5}) {
        OverlapCase c;
        c.kind = kind;
        c.config = make_overlap_config(60, 84, 108, per_rank == 1 ? DType::f32 : DType::bf16,
                                       per_rank * W, order);
        expect_case_on_device(W, c);
      }
  expect_captured_run_replays(W, OverlapKind::gemm_reduce_scatter, OverlapOrder::ring);
  unsetenv("PMOE_OVERLAP_COPY");
}

INSTANTIATE_TEST_SUITE_P(W, OverlapCuda, ::testing::Values(1, 2, 3, 4));

// A tensor on the CPU given to an op on the device is named before anything is launched (no
// kernel of this thread between the call and the error); the op stays usable.
template <typename Op>
void expect_host_b_named(std::array<int64_t, 2> a, std::array<int64_t, 2> b,
                         std::array<int64_t, 2> c) {
  run_ranks(2, [&](Communicator& comm) {
    OverlapConfig cfg = make_overlap_config(8, 4, 6, DType::f32);
    Op op(comm, cfg, Device::cuda(0));
    Buffer A(DType::f32, {a[0], a[1]}, Device::cuda(0)), B(DType::f32, {b[0], b[1]});
    Buffer C(DType::f32, {c[0], c[1]}, Device::cuda(0));
    const uint64_t launched = kernels_launched();
    try {
      op.run(A, B, C);
      ADD_FAILURE() << "a host B was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("`B`"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
    }
    EXPECT_EQ(kernels_launched(), launched) << "a kernel ran before the check";
    Buffer device_B(DType::f32, {b[0], b[1]}, Device::cuda(0));
    op.run(A, device_B, C);  // still usable
    synchronize(comm.stream());
  }, Device::cuda(0));
}

TEST(OverlapCudaInput, AHostTensorIsNamed) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  expect_host_b_named<AllGatherGemm>({4, 6}, {6, 2}, {8, 2});
  expect_host_b_named<GemmReduceScatter>({8, 3}, {3, 4}, {4, 4});
}

// A rank that builds the op and never calls it: rank 0's wait kernels give up after
// PMOE_TIMEOUT_S and write the fault word; rank 0's next call names rank 1 before it launches
// anything, and the op is retired (the call after says so).
template <typename Op>
void expect_absent_rank_named(const char* op_name) {
  setenv("PMOE_TIMEOUT_S", "0.3", 1);
  const OverlapConfig cfg = make_overlap_config(8, 4, 6, DType::f32, 2);
  std::vector<std::string> second(2), third(2);
  run_ranks(2, [&](Communicator& comm) {
    Op op(comm, cfg, Device::cuda(0));
    if (comm.rank() == 1) return;  // builds the op, never calls it
    constexpr bool gather = std::is_same_v<Op, AllGatherGemm>;
    Buffer A(DType::f32, {gather ? 4 : 8, gather ? 6 : 3}, Device::cuda(0));
    Buffer B(DType::f32, {gather ? 6 : 3, gather ? 2 : 4}, Device::cuda(0));
    Buffer C(DType::f32, {gather ? 8 : 4, gather ? 2 : 4}, Device::cuda(0));
    op.run(A, B, C);               // enqueued; its wait for rank 1 gives up on the device
    synchronize(comm.stream());    // bounded by the timeout
    const uint64_t launched = kernels_launched();
    for (std::string* message : {&second[0], &third[0]}) {
      try {
        op.run(A, B, C);
      } catch (const Error& e) {
        *message = e.what();
      }
    }
    EXPECT_EQ(kernels_launched(), launched) << "a call after the timeout launched a kernel";
  }, Device::cuda(0));
  unsetenv("PMOE_TIMEOUT_S");
  EXPECT_NE(second[0].find(std::string(op_name) + " on rank 0 (cuda:0): rank 1 did not deliver a "
                           "piece within 0.3 s"),
            std::string::npos)
      << second[0];
  EXPECT_NE(third[0].find("is unusable since an earlier call failed"), std::string::npos)
      << third[0];
}

TEST(OverlapCudaInput, AnUnknownCopyModeIsNamed) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  setenv("PMOE_OVERLAP_COPY", "dma", 1);
  std::vector<std::string> errors(2);
  run_ranks(2, [&](Communicator& comm) {
    try {
      GemmReduceScatter op(comm, make_overlap_config(8, 4, 6, DType::f32), Device::cuda(0));
    } catch (const Error& e) {
      errors[size_t(comm.rank())] = e.what();
    }
  }, Device::cuda(0));
  unsetenv("PMOE_OVERLAP_COPY");
  for (const std::string& e : errors)
    EXPECT_NE(e.find("PMOE_OVERLAP_COPY must be engine or kernel, got 'dma'"), std::string::npos)
        << e;
}

TEST(OverlapCudaInput, ARankThatNeverCallsIsNamed) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  expect_absent_rank_named<AllGatherGemm>("AllGatherGemm");
  expect_absent_rank_named<GemmReduceScatter>("GemmReduceScatter");
}

}  // namespace
}  // namespace pmoe::testing
