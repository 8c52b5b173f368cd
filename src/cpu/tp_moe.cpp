// TpMoe on the CPU: every rank runs all tokens through its hidden slice of every expert
// (LocalMoe), which gives a partial output; one all-reduce of the partials per forward completes
// it.
//
// Per rank and forward (B tokens, k slots, W ranks): expert FLOPs 2 B k (g H + O) F / W, router
// FLOPs 2 B H E (replicated), bytes sent 2 (W - 1) / W * B O * 4 (f32 partials).
#include <chrono>
#include <memory>

#include "backends/moe_backend.hpp"
#include "cpu/all_reduce.hpp"
#include "cpu/local_moe.hpp"

namespace pmoe::detail {
namespace {

class CpuTpMoe final : public MoeBackend {
 public:
  CpuTpMoe(Communicator& comm, const MoeConfig& config, int max_tokens)
      : config_(config),
        moe_(config, max_tokens, comm.rank() * (config.ffn_dim / comm.size()),
             (comm.rank() + 1) * (config.ffn_dim / comm.size())),
        all_reduce_(comm, int64_t(max_tokens) * config.out_dim()),
        partial_(DType::f32, {max_tokens, config.out_dim()}) {}

  void forward(const Tensor& x, const Tensor& y, MoeStats& stats) override {
    const int64_t n = x.size(0) * config_.out_dim();
    float* partial = config_.dtype == DType::f32 ? y.data<float>() : partial_.data<float>();
    moe_.forward(x, partial, stats);
    const auto start = std::chrono::steady_clock::now();
    all_reduce_.run(partial, n, "TpMoe::forward");
    stats.reduce_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats.bytes_moved = all_reduce_.bytes_sent(n);
    if (config_.dtype != DType::f32) rows_from_f32(partial, config_.out_dim(), y);
  }

  size_t weight_bytes() const override { return moe_.weight_bytes(); }
  size_t workspace_bytes() const override {
    return moe_.workspace_bytes() + all_reduce_.workspace_bytes() + partial_.nbytes();
  }

 private:
  MoeConfig config_;
  LocalMoe moe_;
  cpu::AllReduceSum all_reduce_;
  Buffer partial_;  // [max_tokens, O] f32
};

}  // namespace

std::unique_ptr<MoeBackend> make_cpu_tp_moe(Communicator& comm, const MoeConfig& config,
                                            int max_tokens) {
  return std::make_unique<CpuTpMoe>(comm, config, max_tokens);
}

}  // namespace pmoe::detail
