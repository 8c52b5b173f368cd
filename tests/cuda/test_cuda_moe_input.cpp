// Bad input to the MoE layers on one CUDA device, ranks as threads sharing it: a tensor on the
// wrong device, of the wrong dtype or shape, named before any kernel runs; TpMoe ranks with
// different token counts told on the device; a TpMoe rank whose partial never lands named after
// the timeout. Every layer stays usable.
// Built for the emulated device and for a GPU (tests/cuda/cuda_test_flavor.hpp).
#include <gtest/gtest.h>

// After the standard headers: the emulated device's defines qualifiers such as __noinline__.
#include <atomic>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "cpu/gemm.hpp"
#include "cuda/cuda_test_flavor.hpp"
#include "moe_cases.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"
#include "reference/moe_reference.hpp"

namespace pmoe::testing {
namespace {

// A tensor on the wrong device, a wrong dtype or shape: named, before anything is launched; the
// layer stays usable.
TEST(MoeCudaInput, BadTensorsAreNamed) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const MoeConfig cfg = make_moe_config(8, 16, 4, 2);
  SimpleMoe layer(cfg, 4, Device::cuda(0));
  Buffer x(DType::f32, {4, 8}, Device::cuda(0)), y(DType::f32, {4, 8}, Device::cuda(0));
  Buffer host_x(DType::f32, {4, 8}), bf16_y(DType::bf16, {4, 8}, Device::cuda(0));
  Buffer short_y(DType::f32, {3, 8}, Device::cuda(0));
  auto expect_error = [&](const Tensor& xa, const Tensor& ya, const std::string& words) {
    try {
      layer.forward(xa, ya);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error(host_x, y, "`x` must be on cuda:0, got cpu");
  expect_error(x, bf16_y, "`y` must be f32");
  expect_error(x, short_y, "`y` must have shape [4, 8]");
  layer.forward(x, y);  // still usable
  synchronize(Stream());
}

// The collective layers: every rank passes a host x (or a bf16 y for an f32 model), every rank
// throws naming it, and the layer still runs a correct call afterwards.
TEST(MoeCudaInput, CollectiveLayersNameBadTensorsAndStayUsable) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  const MoeConfig cfg = make_moe_config(8, 16, 4, 2);
  run_ranks(
      2,
      [&](Communicator& comm) {
        EpMoe ep(comm, cfg, 4, 2);
        TpMoe tp(comm, cfg, 4);
        Buffer x(DType::f32, {4, 8}, Device::cuda(0)), y(DType::f32, {4, 8}, Device::cuda(0));
        Buffer host_x(DType::f32, {4, 8}), bf16_y(DType::bf16, {4, 8}, Device::cuda(0));
        auto expect_error = [](const std::function<void()>& call, const std::string& words) {
          try {
            call();
            ADD_FAILURE() << "accepted: " << words;
          } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
          }
        };
        expect_error([&] { ep.forward(host_x, y); },
                     "EpMoe::forward: `x` must be on cuda:0, got cpu");
        expect_error([&] { tp.forward(x, bf16_y); }, "TpMoe::forward: `y` must be f32");
        ep.forward(x, y);
        tp.forward(x, y);
        synchronize(comm.stream());
      },
      Device::cuda(0));
}

// TP replicates tokens: ranks that pass different token counts all throw the CPU layer's error
// (tests/test_moe_errors.cpp) before anything is launched, so the layer then runs a correct call
// (a signal of the rejected call would have left the ranks' call numbers apart).
// TpMoe compares the ranks' token counts on the device (no host exchange): the call with 4 and 3
// tokens returns on both ranks and sums nothing; once the stream has passed it, the next call
// names both counts at entry, launching nothing; the call after that runs as usual.
TEST(MoeCudaInput, TpRanksWithDifferentTokenCountsAreToldOnTheDevice) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  cpu::set_blas_threads(1);
  const MoeConfig cfg = make_moe_config(16, 32, 4, 2);
  const int H = cfg.hidden_dim, O = cfg.out_dim();
  std::vector<std::string> first(2), errors(2), after(2);
  std::vector<uint64_t> launched_by_second(2);
  run_ranks(
      2,
      [&](Communicator& comm) {
        const int r = comm.rank(), m = r == 0 ? 4 : 3;
        TpMoe tp(comm, cfg, 4);
        const Buffer input = reference::make_moe_input(cfg, 4, 1);
        Buffer x(cfg.dtype, {4, H}, Device::cuda(0)), y(cfg.dtype, {4, O}, Device::cuda(0));
        copy(x, input);
        try {
          tp.forward(Tensor(x.data<void>(), cfg.dtype, {m, H}, Device::cuda(0)),
                     Tensor(y.data<void>(), cfg.dtype, {m, O}, Device::cuda(0)));
          first[size_t(r)] = "(no error)";
        } catch (const Error& e) {
          first[size_t(r)] = e.what();
        }
        synchronize(comm.stream());
        const uint64_t launched = kernels_launched();
        try {
          tp.forward(x, y);
          errors[size_t(r)] = "(no error)";
        } catch (const Error& e) {
          errors[size_t(r)] = e.what();
        }
        launched_by_second[size_t(r)] = kernels_launched() - launched;
        tp.forward(x, y);
        synchronize(comm.stream());
        Buffer y_host(cfg.dtype, {4, O});
        copy(y_host, y);
        const auto cmp =
            reference::compare_moe(cfg, reference::reference_moe(cfg, input, {0, 1, 2, 3}), y_host,
                                   0, reference::moe_tolerance(cfg.dtype));
        after[size_t(r)] = cmp.compared == 0 ? "nothing compared" : cmp.error;
      },
      Device::cuda(0));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(first[size_t(r)], "(no error)") << "rank " << r;
    EXPECT_NE(errors[size_t(r)].find(r == 0 ? "rank 1 all-reduces 48 elements but rank 0 has 64"
                                            : "rank 0 all-reduces 64 elements but rank 1 has 48"),
              std::string::npos)
        << errors[size_t(r)];
    EXPECT_NE(errors[size_t(r)].find("every rank must pass the same number of tokens"),
              std::string::npos)
        << errors[size_t(r)];
    EXPECT_EQ(launched_by_second[size_t(r)], 0u) << "rank " << r;
    EXPECT_EQ(after[size_t(r)], "") << "rank " << r;
  }
}

// A TpMoe rank whose partial never lands: rank 1 enters forward, but captures it into a graph it
// never launches. Rank 0's wait gives up after
// PMOE_TIMEOUT_S and writes the fault word; its next forward names rank 1 and the wait, before it
// launches anything.
TEST(MoeCudaInput, TpRankWhosePartialNeverLandsIsNamed) {
  PMOE_REQUIRE_CUDA_RUNTIME();
  cpu::set_blas_threads(1);
  // 2 s: long enough for the ranks' collective construction under the sanitizers, which this
  // timeout bounds too.
  setenv("PMOE_TIMEOUT_S", "2", 1);
  const MoeConfig cfg = make_moe_config(8, 16, 4, 2);
  std::string second;
  std::atomic<bool> first_call_done{false};
  uint64_t launched_by_second = 0;
  run_ranks(
      2,
      [&](Communicator& comm) {
        TpMoe tp(comm, cfg, 4);
        Buffer x(DType::f32, {4, 8}, Device::cuda(0)), y(DType::f32, {4, 8}, Device::cuda(0));
        if (comm.rank() == 1) {
          auto stream = static_cast<cudaStream_t>(comm.stream().handle);
          for (int call = 0; call < 2; ++call) {
            // The second waits until rank 0 has seen its first call time out, so that this
            // rank's host exchange does not time out meanwhile.
            while (call == 1 && !first_call_done.load()) std::this_thread::yield();
            cudaGraph_t graph = nullptr;
            EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                      cudaSuccess);
            tp.forward(x, y);
            EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
            if (graph) cudaGraphDestroy(graph);  // never launched: no partial, no signal
          }
          return;
        }
        tp.forward(x, y);            // its wait for rank 1's partial gives up on the device
        synchronize(comm.stream());  // bounded by the timeout
        first_call_done = true;
        const uint64_t launched = kernels_launched();
        try {
          tp.forward(x, y);
        } catch (const Error& e) {
          second = e.what();
        }
        launched_by_second = kernels_launched() - launched;
      },
      Device::cuda(0));
  unsetenv("PMOE_TIMEOUT_S");
  EXPECT_NE(second.find("TpMoe::forward on rank 0 (cuda:0): rank 1 did not deliver its partial "
                        "output within 2 s"),
            std::string::npos)
      << second;
  EXPECT_EQ(launched_by_second, 0u) << "a call after the timeout launched a kernel";
}

}  // namespace
}  // namespace pmoe::testing
