// SimpleMoe: the whole layer on one rank, through LocalMoe with every expert whole on the CPU,
// or through the device data path (src/cuda/moe) on a CUDA device.
#include "backends/registry.hpp"
#include "moe/layer_args.hpp"
#include "moe/local_moe.hpp"

namespace pmoe {

struct SimpleMoe::Impl {
  Impl(const MoeConfig& config, int max_tokens, Device device, Stream stream)
      : config(config), max_tokens(max_tokens), device(device) {
    if (device.kind != Device::Kind::cpu) {
      on_device = detail::backends(device).make_simple_moe(config, max_tokens, device, stream);
      return;
    }
    moe = std::make_unique<detail::LocalMoe>(config, max_tokens, 0, config.ffn_dim);
    if (config.dtype != DType::f32) y_f32 = Buffer(DType::f32, {max_tokens, config.out_dim()});
  }
  MoeConfig config;
  int max_tokens;
  Device device;
  std::unique_ptr<detail::LocalMoe> moe;       // on the CPU
  std::unique_ptr<detail::MoeBackend> on_device;  // on a CUDA device
  Buffer y_f32;  // [max_tokens, O] f32 when y is bf16 (CPU)
  MoeStats stats;
};

namespace {
const MoeConfig& validated(const MoeConfig& config, int max_tokens) {
  config.validate();
  detail::check_max_tokens("SimpleMoe", "max_tokens", max_tokens);
  return config;
}
}  // namespace

SimpleMoe::SimpleMoe(const MoeConfig& config, int max_tokens)
    : SimpleMoe(config, max_tokens, Device::cpu()) {}

SimpleMoe::SimpleMoe(const MoeConfig& config, int max_tokens, Device device, Stream stream)
    : impl_(std::make_unique<Impl>(validated(config, max_tokens), max_tokens, device, stream)) {}

SimpleMoe::~SimpleMoe() = default;

void SimpleMoe::forward(const Tensor& x, const Tensor& y) {
  Impl& p = *impl_;
  detail::check_forward("SimpleMoe::forward", p.config, p.max_tokens, "max_tokens", x, y, p.device);
  p.stats = MoeStats();
  if (p.on_device) {
    p.on_device->forward(x, y, p.stats);
    return;
  }
  float* acc = p.config.dtype == DType::f32 ? y.data<float>() : p.y_f32.data<float>();
  p.moe->forward(x, acc, p.stats);
  if (p.config.dtype != DType::f32) detail::rows_from_f32(acc, p.config.out_dim(), y);
}

const MoeConfig& SimpleMoe::config() const { return impl_->config; }
Device SimpleMoe::device() const { return impl_->device; }
size_t SimpleMoe::weight_bytes() const {
  return impl_->on_device ? impl_->on_device->weight_bytes() : impl_->moe->weight_bytes();
}
size_t SimpleMoe::workspace_bytes() const {
  if (impl_->on_device) return impl_->on_device->workspace_bytes();
  return impl_->moe->workspace_bytes() + impl_->y_f32.nbytes();
}
const MoeStats& SimpleMoe::last_stats() const {
  if (impl_->on_device) impl_->on_device->finish_stats(impl_->stats);
  return impl_->stats;
}

}  // namespace pmoe
