// SimpleMoe on the CPU: the whole layer on one rank, through LocalMoe with every expert whole.
// Sums are in f32; a bf16 layer rounds them into y at the end.
#include <memory>

#include "backends/moe_backend.hpp"
#include "cpu/local_moe.hpp"

namespace pmoe::detail {
namespace {

class CpuSimpleMoe final : public MoeBackend {
 public:
  CpuSimpleMoe(const MoeConfig& config, int max_tokens)
      : config_(config), moe_(config, max_tokens, 0, config.ffn_dim) {
    if (config.dtype != DType::f32) y_f32_ = Buffer(DType::f32, {max_tokens, config.out_dim()});
  }

  void forward(const Tensor& x, const Tensor& y, MoeStats& stats) override {
    float* acc = config_.dtype == DType::f32 ? y.data<float>() : y_f32_.data<float>();
    moe_.forward(x, acc, stats);
    if (config_.dtype != DType::f32) rows_from_f32(acc, config_.out_dim(), y);
  }

  size_t weight_bytes() const override { return moe_.weight_bytes(); }
  size_t workspace_bytes() const override { return moe_.workspace_bytes() + y_f32_.nbytes(); }

 private:
  MoeConfig config_;
  LocalMoe moe_;
  Buffer y_f32_;  // [max_tokens, O] f32 when y is bf16
};

}  // namespace

std::unique_ptr<MoeBackend> make_cpu_simple_moe(const MoeConfig& config, int max_tokens, Device,
                                                Stream) {
  return std::make_unique<CpuSimpleMoe>(config, max_tokens);
}

}  // namespace pmoe::detail
