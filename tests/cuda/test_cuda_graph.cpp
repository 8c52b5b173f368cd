// Graph capture across streams, one thread, one device: CUDA's rules as the emulated device
// follows them (src/cuda/emulator/graphs.cpp) -- a stream joins a capture by waiting on an
// event recorded in it, the capture ends only once every joined stream is joined back, a wait on
// an event from outside the capture is an isolation error -- and a replay runs every branch in
// order with the launch stream. Built for the emulated device and for a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/cuda_test_flavor.hpp"

namespace pmoe::testing {
namespace {

#define EXPECT_CUDA(call) EXPECT_EQ((call), cudaSuccess) << #call

class GraphCapture : public ::testing::Test {
 protected:
  void SetUp() override {
    PMOE_REQUIRE_CUDA_RUNTIME();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&origin_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&third_, cudaStreamNonBlocking), cudaSuccess);
    for (cudaEvent_t* e : {&fork_, &join_, &other_})
      ASSERT_EQ(cudaEventCreateWithFlags(e, cudaEventDisableTiming), cudaSuccess);
    for (void** p : {&in_, &a_, &b_, &c_, &d_}) ASSERT_EQ(cudaMalloc(p, kBytes), cudaSuccess);
  }
  void TearDown() override {
    if (!origin_) return;  // skipped
    for (cudaStream_t s : {origin_, side_, third_}) {
      EXPECT_CUDA(cudaStreamSynchronize(s));
      EXPECT_CUDA(cudaStreamDestroy(s));
    }
    for (cudaEvent_t e : {fork_, join_, other_}) EXPECT_CUDA(cudaEventDestroy(e));
    for (void* p : {in_, a_, b_, c_, d_}) EXPECT_CUDA(cudaFree(p));
    (void)cudaGetLastError();
  }

  // origin: in -> a, fork; side: a -> b; origin: a -> c, join; origin: b -> d.
  void capture_fork_join() {
    EXPECT_CUDA(cudaMemcpyAsync(a_, in_, kBytes, cudaMemcpyDeviceToDevice, origin_));
    EXPECT_CUDA(cudaEventRecord(fork_, origin_));
    EXPECT_CUDA(cudaStreamWaitEvent(side_, fork_, 0));
    EXPECT_CUDA(cudaMemcpyAsync(b_, a_, kBytes, cudaMemcpyDeviceToDevice, side_));
    EXPECT_CUDA(cudaMemcpyAsync(c_, a_, kBytes, cudaMemcpyDeviceToDevice, origin_));
    EXPECT_CUDA(cudaEventRecord(join_, side_));
    EXPECT_CUDA(cudaStreamWaitEvent(origin_, join_, 0));
    EXPECT_CUDA(cudaMemcpyAsync(d_, b_, kBytes, cudaMemcpyDeviceToDevice, origin_));
  }

  static constexpr size_t kBytes = 4096;
  cudaStream_t origin_ = nullptr, side_ = nullptr, third_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr, other_ = nullptr;
  void *in_ = nullptr, *a_ = nullptr, *b_ = nullptr, *c_ = nullptr, *d_ = nullptr;
};

TEST_F(GraphCapture, ForkAndJoinReplayBothBranchesWithNewInputs) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(origin_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  capture_fork_join();
  ASSERT_EQ(cudaStreamEndCapture(origin_, &graph), cudaSuccess);
  ASSERT_NE(graph, nullptr);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  std::vector<unsigned char> input(kBytes), c(kBytes), d(kBytes);
  for (int replay = 0; replay < 3; ++replay) {
    for (size_t i = 0; i < kBytes; ++i) input[i] = static_cast<unsigned char>(i * 7 + replay * 13);
    EXPECT_CUDA(cudaMemcpyAsync(in_, input.data(), kBytes, cudaMemcpyHostToDevice, origin_));
    EXPECT_CUDA(cudaGraphLaunch(exec, origin_));
    EXPECT_CUDA(cudaMemcpyAsync(c.data(), c_, kBytes, cudaMemcpyDeviceToHost, origin_));
    EXPECT_CUDA(cudaMemcpyAsync(d.data(), d_, kBytes, cudaMemcpyDeviceToHost, origin_));
    EXPECT_CUDA(cudaStreamSynchronize(origin_));
    EXPECT_EQ(std::memcmp(c.data(), input.data(), kBytes), 0) << "origin branch, replay " << replay;
    EXPECT_EQ(std::memcmp(d.data(), input.data(), kBytes), 0) << "side branch, replay " << replay;
  }
  EXPECT_CUDA(cudaGraphExecDestroy(exec));
  EXPECT_CUDA(cudaGraphDestroy(graph));
}

// third is joined into side, side into origin: third is joined too.
TEST_F(GraphCapture, AJoinThroughAnotherBranchCounts) {
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(origin_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_CUDA(cudaEventRecord(fork_, origin_));
  EXPECT_CUDA(cudaStreamWaitEvent(side_, fork_, 0));
  EXPECT_CUDA(cudaStreamWaitEvent(third_, fork_, 0));
  EXPECT_CUDA(cudaMemcpyAsync(b_, a_, kBytes, cudaMemcpyDeviceToDevice, third_));
  EXPECT_CUDA(cudaEventRecord(other_, third_));
  EXPECT_CUDA(cudaStreamWaitEvent(side_, other_, 0));
  EXPECT_CUDA(cudaEventRecord(join_, side_));
  EXPECT_CUDA(cudaStreamWaitEvent(origin_, join_, 0));
  EXPECT_EQ(cudaStreamEndCapture(origin_, &graph), cudaSuccess);
  EXPECT_NE(graph, nullptr);
  if (graph) {
    EXPECT_CUDA(cudaGraphDestroy(graph));
  }
}

TEST_F(GraphCapture, AForkNotJoinedBackEndsTheCaptureWithAnError) {
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(origin_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_CUDA(cudaEventRecord(fork_, origin_));
  EXPECT_CUDA(cudaStreamWaitEvent(side_, fork_, 0));
  EXPECT_CUDA(cudaMemcpyAsync(b_, a_, kBytes, cudaMemcpyDeviceToDevice, side_));
  EXPECT_EQ(cudaStreamEndCapture(origin_, &graph), cudaErrorStreamCaptureUnjoined);
  EXPECT_EQ(graph, nullptr);
  // Both streams left the capture: they run work again.
  (void)cudaGetLastError();
  EXPECT_CUDA(cudaMemcpyAsync(c_, a_, kBytes, cudaMemcpyDeviceToDevice, side_));
  EXPECT_CUDA(cudaStreamSynchronize(side_));
  EXPECT_CUDA(cudaStreamSynchronize(origin_));
}

// The join must come after the branch's last work: a record before it joins nothing.
TEST_F(GraphCapture, AJoinBeforeTheBranchsLastWorkDoesNotCount) {
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(origin_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_CUDA(cudaEventRecord(fork_, origin_));
  EXPECT_CUDA(cudaStreamWaitEvent(side_, fork_, 0));
  EXPECT_CUDA(cudaEventRecord(join_, side_));
  EXPECT_CUDA(cudaStreamWaitEvent(origin_, join_, 0));
  EXPECT_CUDA(cudaMemcpyAsync(b_, a_, kBytes, cudaMemcpyDeviceToDevice, side_));
  EXPECT_EQ(cudaStreamEndCapture(origin_, &graph), cudaErrorStreamCaptureUnjoined);
  EXPECT_EQ(graph, nullptr);
}

TEST_F(GraphCapture, WaitingOnAnEventFromOutsideTheCaptureInvalidatesIt) {
  EXPECT_CUDA(cudaEventRecord(other_, third_));  // not captured
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(origin_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(origin_, other_, 0), cudaErrorStreamCaptureIsolation);
  EXPECT_EQ(cudaStreamEndCapture(origin_, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
}

TEST_F(GraphCapture, OnlyTheOriginEndsTheCaptureAndCapturedEventsCannotBeQueried) {
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(origin_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  capture_fork_join();
  EXPECT_EQ(cudaEventQuery(join_), cudaErrorCapturedEvent);
  EXPECT_EQ(cudaStreamEndCapture(side_, &graph), cudaErrorStreamCaptureUnmatched);
  EXPECT_EQ(graph, nullptr);
  (void)cudaStreamEndCapture(origin_, &graph);  // CUDA may have invalidated the capture
  if (graph) {
    EXPECT_CUDA(cudaGraphDestroy(graph));
  }
}

}  // namespace
}  // namespace pmoe::testing
