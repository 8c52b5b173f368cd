// The router on a device: the logits GEMM through cuBLAS, then top-k and the softmax over the k
// in one kernel (moe_kernels.cuh), the CPU Router's rule for ties (the lower expert), so both
// backends pick the same experts.
//
//   x [m, H] f32 . Wg [H, E] f32 -> logits [m, E] f32 -> indices [m, k] i32, weights [m, k] f32
#pragma once

#include <vector>

#include "cuda/flavor.hpp"
#include "cuda/gemm/batched_gemm.hpp"
#include "cuda/moe/moe_kernels.cuh"
#include "moe/weights.hpp"
#include "pmoe/moe.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

class DeviceRouter {
 public:
  DeviceRouter(const MoeConfig& config, int max_tokens, Device device) : config_(config) {
    const int H = config.hidden_dim, E = config.num_experts;
    std::vector<float> wg(size_t(H) * E);
    detail::fill_weights(config, MoeTensor::router, 0, 0, H, 0, E, wg.data(), E);
    weights_ = Buffer(DType::f32, {H, E}, device);
    copy(weights_, Tensor(wg.data(), DType::f32, {H, E}));
    logits_ = Buffer(DType::f32, {max_tokens, E}, device);
  }

  // x [m, H] f32 contiguous (device); indices [m, k] i32 and weights [m, k] f32 (out, device).
  void route(cublasHandle_t handle, cudaStream_t stream, int m, const float* x, int32_t* indices,
             float* weights) const {
    if (m == 0) return;
    const int H = config_.hidden_dim, E = config_.num_experts;
    gemm_batched_row_major(handle, m, E, H, x, H, 0, weights_.data<float>(), E, 0,
                           logits_.data<float>(), E, 0, 1);
    TopKSoftmax t;
    t.logits = logits_.data<float>();
    t.indices = indices;
    t.weights = weights;
    t.m = m;
    t.num_experts = E;
    t.top_k = config_.top_k;
    launch_top_k_softmax(t, stream);
  }

  size_t weight_bytes() const { return weights_.nbytes(); }
  size_t workspace_bytes() const { return logits_.nbytes(); }
  double flops(int64_t tokens) const {
    return 2.0 * double(tokens) * config_.hidden_dim * config_.num_experts;
  }

 private:
  MoeConfig config_;
  Buffer weights_;  // Wg [H, E] f32
  Buffer logits_;   // [max_tokens, E] f32
};

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
