// SimpleMoe's front end: the whole layer on one rank. It validates the config and every call's
// tensors; the backend for the device (src/backends/registry.hpp) does the work: the CPU's
// (src/cpu/simple_moe.cpp) or a device's (src/cuda/moe/simple_moe.cu).
#include "backends/registry.hpp"
#include "moe/layer_core.hpp"

namespace pmoe {

struct SimpleMoe::Impl : detail::LayerCore {
  Impl(const MoeConfig& config, int max_tokens, Device device, Stream stream)
      : LayerCore(config, max_tokens, device) {
    backend = detail::backends(device).make_simple_moe(LayerCore::config, max_tokens, device,
                                                       stream);
  }
};

namespace {
MoeConfig validated(const MoeConfig& config, int max_tokens) {
  config.validate();
  detail::check_max_tokens("SimpleMoe", "max_tokens", max_tokens);
  return config.with_current_names();
}
}  // namespace

SimpleMoe::SimpleMoe(const MoeConfig& config, int max_tokens)
    : SimpleMoe(config, max_tokens, Device::cpu()) {}

SimpleMoe::SimpleMoe(const MoeConfig& config, int max_tokens, Device device, Stream stream)
    : impl_(std::make_unique<Impl>(validated(config, max_tokens), max_tokens, device, stream)) {}

SimpleMoe::~SimpleMoe() = default;

void SimpleMoe::forward(const Tensor& x, const Tensor& y) {
  impl_->forward("SimpleMoe::forward", x, y);
}

const MoeConfig& SimpleMoe::config() const { return impl_->config; }
Device SimpleMoe::device() const { return impl_->device; }
size_t SimpleMoe::weight_bytes() const { return impl_->backend->weight_bytes(); }
size_t SimpleMoe::workspace_bytes() const { return impl_->backend->workspace_bytes(); }
const MoeStats& SimpleMoe::last_stats() const { return impl_->last_stats(); }

}  // namespace pmoe
