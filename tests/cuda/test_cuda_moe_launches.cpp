// What a forward of the MoE layers puts on the stream of one CUDA device, ranks as threads
// sharing it: a whole forward captured into a CUDA graph and replayed with new inputs against the
// reference (EpMoe, TpMoe); one forward's kernels, stream work and host syncs, with and without
// device_stats, counted by the emulated device.
// Built for the emulated device and for a GPU (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

// After the standard headers: the emulated device's defines qualifiers such as __noinline__.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cpu/gemm.hpp"
#include "cuda/cuda_moe_test_helpers.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "moe_cases.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::testing {
namespace {

// A whole forward captured into a CUDA graph on each rank (EpMoe with both micro-batch counts:
// two streams, AllToAll, cuBLAS, the kernels; TpMoe: its signal words) and replayed with new
// inputs written into the captured x: every replay matches the reference.
TEST(MoeCudaGraph, ForwardCapturedAndReplayedWithNewInputs) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  cpu::set_blas_threads(1);
  for (MoeVariant v : {MoeVariant::ep, MoeVariant::tp})
    for (int mb : {1, 2}) {
      if (v == MoeVariant::tp && mb == 2) continue;
      const int W = 3, batch = 4 * W + 2;
      MoeConfig cfg = base_case(v, W, Activation::swiglu, DType::bf16).config;
      cfg.device_stats = true;  // what a captured forward must leave uncounted
      std::vector<std::string> errors(W);
      run_ranks(
          W,
          [&](Communicator& comm) {
            const RowRange mine =
                v == MoeVariant::ep ? shard_rows(batch, W, comm.rank()) : RowRange{0, batch};
            std::unique_ptr<EpMoe> ep;
            std::unique_ptr<TpMoe> tp;
            if (v == MoeVariant::ep)
              ep = std::make_unique<EpMoe>(comm, cfg, shard_rows(batch, W, 0).size(), mb);
            else
              tp = std::make_unique<TpMoe>(comm, cfg, batch);
            const int H = cfg.hidden_dim, O = cfg.out_dim();
            Buffer x(cfg.dtype, {mine.size(), H}, Device::cuda(0));
            Buffer y(cfg.dtype, {mine.size(), O}, Device::cuda(0));
            Buffer y_host(cfg.dtype, {mine.size(), O});
            auto stream = static_cast<cudaStream_t>(comm.stream().handle);
            cudaGraph_t graph = nullptr;
            cudaGraphExec_t exec = nullptr;
            std::string& error = errors[size_t(comm.rank())];
            if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
              error = "begin capture failed";
            if (ep) ep->forward(x, y);
            if (tp) tp->forward(x, y);
            if (cudaStreamEndCapture(stream, &graph) != cudaSuccess ||
                cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
              error = "end capture or instantiate failed";
            if (ep && ep->last_stats().bytes_moved != 0)  // a captured forward counts nothing
              error = "bytes_moved of a captured forward";
            for (int replay = 0; replay < 3 && error.empty(); ++replay) {
              const Buffer input = reference::make_moe_input(cfg, batch, 100 + uint64_t(replay));
              const size_t row = size_t(H) * dtype_size(cfg.dtype);
              copy(x, Tensor(input.data<std::byte>() + size_t(mine.begin) * row, cfg.dtype,
                             {mine.size(), H}));
              if (cudaGraphLaunch(exec, stream) != cudaSuccess) error = "launch failed";
              synchronize(comm.stream());
              copy(y_host, y);
              std::vector<int> rows;
              for (int t = mine.begin; t < mine.end; ++t) rows.push_back(t);
              const auto cmp =
                  reference::compare_moe(cfg, reference::reference_moe(cfg, input, rows), y_host,
                                         mine.begin, reference::moe_tolerance(cfg.dtype));
              if (!cmp.error.empty()) error = detail::cat("replay ", replay, ": ", cmp.error);
              if (cmp.compared == 0 && mine.size() > 0) error = "nothing compared";
            }
            if (exec) cudaGraphExecDestroy(exec);
            if (graph) cudaGraphDestroy(graph);
          },
          Device::cuda(0));
      for (int r = 0; r < W; ++r)
        EXPECT_EQ(errors[size_t(r)], "")
            << variant_name(v) << " micro_batches " << mb << " rank " << r;
    }
}

// One forward of each layer, after a first one, counted by the emulated device: no host
// synchronisation, with or without device_stats; its kernels and stream work items, and what
// stats add; last_stats() waits only where stats were asked for.
TEST(MoeCudaStats, LaunchesAndHostSyncsOfOneForward) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  if (!kOnEmulatedDevice) GTEST_SKIP() << "the counts are the emulated device's";
  cpu::set_blas_threads(1);
  struct Count {
    uint64_t kernels, work, syncs, stats_syncs;
  };
  struct Layer {
    MoeVariant v;
    int micro_batches;
    Count without, with;  // expected
  };
  // One forward (bf16, H = O). Kernels: SimpleMoe widen (for the router), top-k, group, gather,
  // plan, the two grouped expert GEMMs, activate, weighted sum = 9; TpMoe those and count call,
  // done wait, publish count, landed, landed wait, sum, done = 16 at W = 2; EpMoe widen, top-k,
  // and a micro-batch's plan, two GEMMs, activate, narrow and AllToAll's (dispatch and combine:
  // 2 each with both phases, 3 each split) = 11 and 24. Work adds the router's cuBLAS GEMM and
  // with two micro-batches 8 event records and waits. Stats add 2 event records a timed phase (SimpleMoe 3, TpMoe 4,
  // EpMoe 4 and 11), the tally's or the end's event, and EpMoe's traffic-count kernel; last_stats()
  // then waits for each phase's end and that event.
  const Layer layers[] = {
      {MoeVariant::simple, 1, {9, 10, 0, 0}, {9, 17, 0, 4}},
      {MoeVariant::tp, 1, {16, 17, 0, 0}, {16, 26, 0, 5}},
      {MoeVariant::ep, 1, {11, 12, 0, 0}, {12, 22, 0, 5}},
      {MoeVariant::ep, 2, {24, 33, 0, 0}, {25, 57, 0, 12}},
  };
  std::string report;
  for (const Layer& l : layers)
    for (bool asked : {false, true}) {
      const int W = l.v == MoeVariant::simple ? 1 : 2;
      MoeConfig cfg = make_moe_config(16, 16, 4, 2, Activation::relu, DType::bf16);
      cfg.device_stats = asked;
      std::vector<Count> counted(static_cast<size_t>(W));
      run_ranks(
          W,
          [&](Communicator& comm) {
            const int m = 8;
            Buffer x(cfg.dtype, {m, 16}, Device::cuda(0)), y(cfg.dtype, {m, 16}, Device::cuda(0));
            copy(x, reference::make_moe_input(cfg, m, 3));
            std::unique_ptr<SimpleMoe> simple;
            std::unique_ptr<TpMoe> tp;
            std::unique_ptr<EpMoe> ep;
            if (l.v == MoeVariant::simple)
              simple = std::make_unique<SimpleMoe>(cfg, m, Device::cuda(0), comm.stream());
            if (l.v == MoeVariant::tp) tp = std::make_unique<TpMoe>(comm, cfg, m);
            if (l.v == MoeVariant::ep) ep = std::make_unique<EpMoe>(comm, cfg, m, l.micro_batches);
            auto forward = [&] {
              if (simple) simple->forward(x, y);
              if (tp) tp->forward(x, y);
              if (ep) ep->forward(x, y);
            };
            forward();
            synchronize(comm.stream());
            const uint64_t kernels = kernels_launched(), work = stream_work(), syncs = host_syncs();
            forward();
            Count& c = counted[size_t(comm.rank())];
            c.kernels = kernels_launched() - kernels;
            c.work = stream_work() - work;
            c.syncs = host_syncs() - syncs;
            const uint64_t before_stats = host_syncs();
            if (simple) (void)simple->last_stats();
            if (tp) (void)tp->last_stats();
            if (ep) (void)ep->last_stats();
            c.stats_syncs = host_syncs() - before_stats;
            synchronize(comm.stream());
            if (comm.side_stream().handle) synchronize(comm.side_stream());
          },
          Device::cuda(0));
      const Count& want = asked ? l.with : l.without;
      for (int r = 0; r < W; ++r) {
        const Count& c = counted[size_t(r)];
        const std::string where = detail::cat(variant_name(l.v), " micro_batches ",
                                              l.micro_batches, " stats ", asked, " rank ", r);
        report += detail::cat(where, ": kernels ", c.kernels, ", work ", c.work, ", syncs ",
                              c.syncs, ", last_stats syncs ", c.stats_syncs, "\n");
        EXPECT_EQ(c.kernels, want.kernels) << where;
        EXPECT_EQ(c.syncs, 0u) << where;
        EXPECT_EQ(c.work, want.work) << where;
        EXPECT_EQ(c.stats_syncs, want.stats_syncs) << where;
      }
    }
  std::cout << report;
}

}  // namespace
}  // namespace pmoe::testing
