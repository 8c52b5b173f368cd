// SimpleMoe: the whole layer on one rank, through LocalMoe with every expert whole.
#include "moe/layer_args.hpp"
#include "moe/local_moe.hpp"

namespace pmoe {

struct SimpleMoe::Impl {
  Impl(const MoeConfig& config, int max_tokens)
      : config(config),
        max_tokens(max_tokens),
        moe(config, max_tokens, 0, config.ffn_dim),
        y_f32(config.dtype == DType::f32 ? Buffer()
                                         : Buffer(DType::f32, {max_tokens, config.out_dim()})) {}
  MoeConfig config;
  int max_tokens;
  detail::LocalMoe moe;
  Buffer y_f32;  // [max_tokens, O] f32 when y is bf16
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
    : impl_(std::make_unique<Impl>(validated(config, max_tokens), max_tokens)) {}

SimpleMoe::~SimpleMoe() = default;

void SimpleMoe::forward(const Tensor& x, const Tensor& y) {
  Impl& p = *impl_;
  detail::check_forward("SimpleMoe::forward", p.config, p.max_tokens, x, y);
  p.stats = MoeStats();
  float* acc = p.config.dtype == DType::f32 ? y.data<float>() : p.y_f32.data<float>();
  p.moe.forward(x, acc, p.stats);
  if (p.config.dtype != DType::f32) detail::rows_from_f32(acc, p.config.out_dim(), y);
}

const MoeConfig& SimpleMoe::config() const { return impl_->config; }
size_t SimpleMoe::weight_bytes() const { return impl_->moe.weight_bytes(); }
size_t SimpleMoe::workspace_bytes() const {
  return impl_->moe.workspace_bytes() + impl_->y_f32.nbytes();
}
const MoeStats& SimpleMoe::last_stats() const { return impl_->stats; }

}  // namespace pmoe
