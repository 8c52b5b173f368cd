// SimpleMoe on a device: the whole layer on one stream through DeviceLocalMoe (local_moe.cuh),
// y written in the model's dtype by the gating kernel.
#include <memory>

#include "backends/moe_backend.hpp"
#include "core/device_runtime.hpp"
#include "cuda/flavor.hpp"
#include "cuda/moe/local_moe.cuh"

namespace pmoe::detail::inline PMOE_CUDA_FLAVOR::moe {
namespace {

class DeviceSimpleMoe final : public MoeBackend {
 public:
  DeviceSimpleMoe(const MoeConfig& config, int max_tokens, Device device, Stream stream)
      : config_(config),
        stream_((set_device(device), static_cast<cudaStream_t>(stream.handle))),
        timer_(cuda::DeviceLocalMoe::kPhases, config.device_stats),
        moe_(config, max_tokens, 0, config.ffn_dim, device, stream_) {}

  void forward(const Tensor& x, const Tensor& y, MoeStats& stats) override {
    timer_.start(stream_);
    moe_.forward(x, y.data(), config_.dtype, stats, timer_);
  }
  void finish_stats(MoeStats& stats) override {
    timer_.finish(stats);
    moe_.finish_stats(stats);
  }
  size_t weight_bytes() const override { return moe_.weight_bytes(); }
  size_t workspace_bytes() const override { return moe_.workspace_bytes(); }

 private:
  MoeConfig config_;
  cudaStream_t stream_;
  cuda::PhaseTimer timer_;
  cuda::DeviceLocalMoe moe_;
};

}  // namespace

std::unique_ptr<MoeBackend> make_simple(const MoeConfig& config, int max_tokens, Device device,
                                        Stream stream) {
  return std::make_unique<DeviceSimpleMoe>(config, max_tokens, device, stream);
}

}  // namespace pmoe::detail::inline PMOE_CUDA_FLAVOR::moe
