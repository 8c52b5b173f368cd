// SimpleMoe's and TpMoe's computation on a device (the CPU's LocalMoe): route, group the
// (token, slot) pairs by expert into slots of capacity m (an expert gets each token at most
// once), gather, both expert GEMMs over tiles of the rows in use (device_experts.hpp), then the
// gating sum. Everything is enqueued on one stream; the counts stay on the device.
//
//   x_f32        [max_tokens, H] f32        x widened for the router (bf16 models), else x
//   indices      [max_tokens, k] i32        weights [max_tokens, k] f32
//   counts       [E] i32                    token_of_row [E, m] i32, row_of_pair [m, k] i32
//   gathered     [E, m, H] dtype            hidden [E, m, g F'] f32, out [E, m, O] f32
//   act          [E, m, F'] dtype           bf16 models only (f32: in place in hidden)
//
// The rows in use are exactly m k, so the tiled GEMMs compute at most m k + E T rows (T the
// tile, device_experts.hpp) where the CPU computes m k; the buffers keep every slot (E m rows).
#pragma once

#include <chrono>

#include "moe/expert_slots.hpp"
#include "cuda/check.hpp"
#include "cuda/flavor.hpp"
#include "cuda/moe/device_experts.hpp"
#include "cuda/moe/device_router.hpp"
#include "cuda/moe/phase_timer.hpp"
#include "pmoe/moe.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

class DeviceLocalMoe {
 public:
  DeviceLocalMoe(const MoeConfig& config, int max_tokens, int ffn_begin, int ffn_end, Device device,
                 cudaStream_t stream)
      : config_(config),
        stream_(stream),
        router_(config, max_tokens, device),
        experts_(config, detail::all_experts(config), ffn_begin, ffn_end,
                 int64_t(max_tokens) * config.top_k, device) {
    const int H = config.hidden_dim, E = config.num_experts, k = config.top_k;
    const int O = config.out_dim();
    if (config.dtype != DType::f32) x_f32_ = Buffer(DType::f32, {max_tokens, H}, device);
    indices_ = Buffer(DType::i32, {max_tokens, k}, device);
    weights_ = Buffer(DType::f32, {max_tokens, k}, device);
    counts_ = Buffer(DType::i32, {E}, device);
    token_of_row_ = Buffer(DType::i32, {E, max_tokens}, device);
    row_of_pair_ = Buffer(DType::i32, {max_tokens, k}, device);
    gathered_ = Buffer(config.dtype, {E, max_tokens, H}, device);
    hidden_ = Buffer(DType::f32, {E, max_tokens, experts_.hidden_ld()}, device);
    if (experts_.separate_act())
      act_ = Buffer(config.dtype, {E, max_tokens, experts_.width()}, device);
    if (config.device_stats) PMOE_CUDA_CHECK(cudaEventCreateWithFlags(&tallied_, cudaEventDisableTiming));
    out_ = Buffer(DType::f32, {E, max_tokens, O}, device);
    PMOE_CUBLAS_CHECK(cublasCreate(&cublas_));
    PMOE_CUBLAS_CHECK(cublasSetStream(cublas_, stream));
  }
  ~DeviceLocalMoe() {
    (void)cudaStreamSynchronize(stream_);
    if (cublas_) (void)cublasDestroy(cublas_);
    if (tallied_) (void)cudaEventDestroy(tallied_);
  }
  DeviceLocalMoe(const DeviceLocalMoe&) = delete;
  DeviceLocalMoe& operator=(const DeviceLocalMoe&) = delete;

  // y (device, [m, O], `y_dtype`: config.dtype, or f32 for TP's partials) = the layer over x.
  // Its phases (route, experts, the gating sum as combine) are bracketed on `timer`, started.
  static constexpr int kPhases = 3;
  void forward(const Tensor& x, void* y, DType y_dtype, MoeStats& stats, PhaseTimer& timer) {
    const int m = int(x.size(0)), H = config_.hidden_dim, E = config_.num_experts;
    const int k = config_.top_k, O = config_.out_dim();
    stats.tokens = m;
    stats.router_flops = router_.flops(m);
    // Issued: the most the GEMMs can compute; with device stats, finish_stats() puts their count.
    stats.expert_rows = experts_.tile_plan(m, int64_t(m) * k, int64_t(m) * k).rows();
    stats.expert_flops = experts_.flops(stats.expert_rows);
    tally_pending_ = false;
    if (m == 0) return;
    timer.begin(&MoeStats::route_s, stream_);
    const float* xf = rows_as_f32(x.data(), config_.dtype, m, H, x_f32_.data<float>(), stream_);
    router_.route(cublas_, stream_, m, xf, indices_.data<int32_t>(), weights_.data<float>());
    timer.end(stream_);

    timer.begin(&MoeStats::experts_s, stream_);
    GroupPairs g;
    g.indices = indices_.data<int32_t>();
    g.counts = counts_.data<int32_t>();
    g.token_of_row = token_of_row_.data<int32_t>();
    g.row_of_pair = row_of_pair_.data<int32_t>();
    g.m = m;
    g.num_experts = E;
    g.top_k = k;
    g.capacity = m;
    launch_group_pairs(g, stream_);
    GatherRows gather;
    gather.x = x.data();
    gather.counts = counts_.data<int32_t>();
    gather.token_of_row = token_of_row_.data<int32_t>();
    gather.gathered = gathered_.data<float>();
    gather.num_experts = E;
    gather.capacity = m;
    gather.H = H;
    launch_gather_rows(gather, int(dtype_size(config_.dtype)), stream_);
    experts_.run(cublas_, stream_, m, int64_t(m) * k, int64_t(m) * k, gathered_.data<void>(), H,
                 hidden_.data<float>(), act_.data<void>(), out_.data<float>(),
                 counts_.data<int32_t>());
    stats.expert_gemm = experts_.gemm_path();
    if (tallied_) {  // device stats: the plan kernel's tally, read by finish_stats()
      PMOE_CUDA_CHECK(cudaEventRecord(tallied_, stream_));
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
      PMOE_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
      tally_pending_ = capture == cudaStreamCaptureStatusNone;
    }
    timer.end(stream_);

    WeightedSum w;
    w.rows = out_.data<float>();
    w.row_of_pair = row_of_pair_.data<int32_t>();
    w.weights = weights_.data<float>();
    w.y = y;
    w.m = m;
    w.top_k = k;
    w.O = O;
    timer.begin(&MoeStats::combine_s, stream_);
    launch_weighted_sum(w, y_dtype, stream_);
    timer.end(stream_);
  }

  // With device stats: the rows in use, the live tiles' rows and the rows issued of the last
  // forward (waits for them), once.
  void finish_stats(MoeStats& stats) {
    if (!tally_pending_) return;
    tally_pending_ = false;
    PMOE_CUDA_CHECK(cudaEventSynchronize(tallied_));
    const DeviceExperts::RowTally t = experts_.tally(1);
    stats.expert_rows_used = t.used;
    stats.expert_rows_live = t.live;
    stats.expert_rows = t.issued;
    stats.expert_flops = experts_.flops(t.issued);
  }

  size_t weight_bytes() const { return router_.weight_bytes() + experts_.weight_bytes(); }
  size_t workspace_bytes() const {
    return router_.workspace_bytes() + experts_.workspace_bytes() + x_f32_.nbytes() +
           indices_.nbytes() + weights_.nbytes() +
           counts_.nbytes() + token_of_row_.nbytes() + row_of_pair_.nbytes() + gathered_.nbytes() +
           hidden_.nbytes() + act_.nbytes() + out_.nbytes();
  }

 private:
  MoeConfig config_;
  cudaStream_t stream_;
  cublasHandle_t cublas_ = nullptr;
  DeviceRouter router_;
  DeviceExperts experts_;
  Buffer x_f32_, indices_, weights_, counts_, token_of_row_, row_of_pair_, gathered_, hidden_, act_,
      out_;
  cudaEvent_t tallied_ = nullptr;  // device stats only: after the plan kernel's tally
  bool tally_pending_ = false;     // a forward's tally that finish_stats has not read
};

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
