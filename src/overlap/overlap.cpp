// The overlap ops' front end: checks that every rank has the same config, validates each call's
// tensors before anything moves, and retires the op after a failed wait. Everything else is the
// backend's (src/cpu/all_gather_gemm.cpp, src/cpu/gemm_reduce_scatter.cpp, src/cuda/overlap),
// which src/backends/registry.hpp gives for the device.
#include <array>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>

#include "backends/registry.hpp"
#include "core/arg_checks.hpp"
#include "core/config_agreement.hpp"
#include "pmoe/error.hpp"
#include "pmoe/overlap.hpp"

namespace pmoe {
namespace detail {

class OverlapOp {
 public:
  // `gather`: AllGatherGemm, else GemmReduceScatter.
  OverlapOp(Communicator& comm, const OverlapConfig& config, Device device, bool gather)
      : name_(gather ? "AllGatherGemm" : "GemmReduceScatter"),
        config_(config),
        comm_(comm),
        rank_(comm.rank()),
        world_size_(comm.size()),
        device_(device) {
    // Every rank must build the op with the same sizes: a rank with another M would write past
    // its peers' buffers.
    ConfigAgreement agree(name_);
    agree.field("M", config.m);
    agree.field("N", config.n);
    agree.field("K", config.k);
    agree.field("dtype", int64_t(config.dtype), show_dtype);
    agree.field("chunks", config.chunks);
    agree.field("min_overlap_bytes", config.min_overlap_bytes);
    agree.field("order", int64_t(config.order), [](int64_t v) {
      return std::string(order_name(OverlapOrder(v)));
    });
    agree.check(comm, [&] {
      config_.validate(name_, world_size_);
      PMOE_CHECK(device == comm.device(), name_, ": device ", device.str(),
                 " differs from the communicator's ", comm.device().str());
    });
    config_.chunks = config_.chunks_for(world_size_);
    const int64_t W = world_size_, M = config_.m, N = config_.n, K = config_.k;
    if (gather) {
      a_shape_ = {M / W, K};
      b_shape_ = {K, N / W};
      c_shape_ = {M, N / W};
      backend_ = backends(device).make_all_gather_gemm(comm, config_);
    } else {
      a_shape_ = {M, K / W};
      b_shape_ = {K / W, N};
      c_shape_ = {M / W, N};
      backend_ = backends(device).make_gemm_reduce_scatter(comm, config_);
    }
    config_.chunks = config.chunks;  // report what the caller gave
  }

  void run(const Tensor& A, const Tensor& B, const Tensor& C) {
    const std::string op = cat(name_, "::run");
    call(op, A, B, C, [&](const OverlapArgs& args) { backend_->run(args); });
  }

  void run_serial(const Tensor& A, const Tensor& B, const Tensor& C, SerialStep step) {
    static constexpr const char* kSteps[] = {"", "(communicate)", "(gemm)"};
    PMOE_CHECK(int(step) <= 2, name_, "::run_serial: unknown step ", int(step));
    const std::string op = cat(name_, "::run_serial", kSteps[int(step)]);
    call(op, A, B, C, [&](const OverlapArgs& args) { backend_->run_serial(args, step); });
  }

  void run_gemm_only(const Tensor& A, const Tensor& B, const Tensor& C) {
    const std::string op = cat(name_, "::run_gemm_only");
    call(op, A, B, C, [&](const OverlapArgs& args) { backend_->run_gemm_only(args); });
  }

  bool overlaps() const { return backend_->overlaps(); }
  size_t workspace_bytes() const { return backend_->workspace_bytes(); }
  const OverlapConfig& config() const { return config_; }

 private:
  void call(const std::string& op, const Tensor& A, const Tensor& B, const Tensor& C,
            const std::function<void(const OverlapArgs&)>& body) {
    try {
      PMOE_CHECK(broken_.empty(), op, " on rank ", rank_, ": this ", name_,
                 " is unusable since an earlier call failed while waiting for peers (", broken_,
                 "); create a new one");
      check_tensor(op, "A", A, config_.dtype, device_, {a_shape_[0], a_shape_[1]});
      check_tensor(op, "B", B, config_.dtype, device_, {b_shape_[0], b_shape_[1]});
      check_tensor(op, "C", C, config_.dtype, device_, {c_shape_[0], c_shape_[1]});
    } catch (const Error& e) {
      comm_.note_rejection(e.what());  // the peers will wait for this call: tell them why
      throw;
    }
    comm_.note_rejection("");
    try {
      body({A, B, C});
    } catch (const std::exception& e) {
      broken_ = e.what();  // peers are mid-protocol: no safe way to continue
      throw;
    }
  }

  const char* name_;
  OverlapConfig config_;
  Communicator& comm_;  // outlives the op (its waits run on the communicator's group)
  int rank_, world_size_;
  Device device_;
  std::array<int64_t, 2> a_shape_{}, b_shape_{}, c_shape_{};
  std::string broken_;
  std::unique_ptr<OverlapBackend> backend_;
};

}  // namespace detail

AllGatherGemm::AllGatherGemm(Communicator& comm, const OverlapConfig& config, Device device)
    : op_(std::make_unique<detail::OverlapOp>(comm, config, device, /*gather=*/true)) {}
AllGatherGemm::~AllGatherGemm() = default;
void AllGatherGemm::run(const Tensor& A, const Tensor& B, const Tensor& C) { op_->run(A, B, C); }
void AllGatherGemm::run_serial(const Tensor& A, const Tensor& B, const Tensor& C, SerialStep step) {
  op_->run_serial(A, B, C, step);
}
void AllGatherGemm::run_gemm_only(const Tensor& A, const Tensor& B, const Tensor& C) {
  op_->run_gemm_only(A, B, C);
}
bool AllGatherGemm::overlaps() const { return op_->overlaps(); }
size_t AllGatherGemm::workspace_bytes() const { return op_->workspace_bytes(); }
const OverlapConfig& AllGatherGemm::config() const { return op_->config(); }

GemmReduceScatter::GemmReduceScatter(Communicator& comm, const OverlapConfig& config, Device device)
    : op_(std::make_unique<detail::OverlapOp>(comm, config, device, /*gather=*/false)) {}
GemmReduceScatter::~GemmReduceScatter() = default;
void GemmReduceScatter::run(const Tensor& A, const Tensor& B, const Tensor& C) {
  op_->run(A, B, C);
}
void GemmReduceScatter::run_serial(const Tensor& A, const Tensor& B, const Tensor& C,
                                   SerialStep step) {
  op_->run_serial(A, B, C, step);
}
void GemmReduceScatter::run_gemm_only(const Tensor& A, const Tensor& B, const Tensor& C) {
  op_->run_gemm_only(A, B, C);
}
bool GemmReduceScatter::overlaps() const { return op_->overlaps(); }
size_t GemmReduceScatter::workspace_bytes() const { return op_->workspace_bytes(); }
const OverlapConfig& GemmReduceScatter::config() const { return op_->config(); }

}  // namespace pmoe
