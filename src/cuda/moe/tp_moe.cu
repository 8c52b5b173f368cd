// TpMoe on a device: every rank runs all tokens through its hidden slice of every expert
// (DeviceLocalMoe, local_moe.cuh), writing its f32 partial output straight into its own
// symmetric region; one all-reduce per forward then sums the W partials, on the rank's stream:
//
//   symmetric region of rank r:  partial [m, O] f32       (max_tokens x O)
//   signals of rank r:           landed = e   (r's partial of call e is in its region)
//                                done = e     (r has read every region for call e)
//                                call         (the call counter; no peer reads it)
//
//   stream: call += 1 | wait every peer's done >= e - 1 | layer -> own region | landed = e
//           | wait every peer's landed >= e | y = sum of the W regions in rank order | done = e
//
// Peers' regions are read with loads (one node: symmetric memory is load/store reachable), summed
// in rank order in f32 and rounded once, so every rank gets the same bits (as on the CPU). A rank
// writes only its own memory; the done words keep it from overwriting a region a peer still
// reads. Waits are bounded (PMOE_TIMEOUT_S); a timed-out wait is raised at the next call's entry.
// Nothing waits on the host, so a forward can be captured in a CUDA graph.
//
// Before it enqueues anything, forward() exchanges every rank's element count on the host (one
// all_gather of 8 bytes): ranks given different token counts all throw the CPU layer's
// pmoe::Error (core/arg_checks.hpp) and no signal moves, so the layer stays usable. The price is
// a host rendezvous per call: a rank's forward returns once every rank has entered its own.
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "core/arg_checks.hpp"
#include "core/device_runtime.hpp"
#include "cuda/check.hpp"
#include "cuda/flavor.hpp"
#include "cuda/moe/local_moe.cuh"
#include "cuda/overlap/signals.cuh"
#include "moe/device_moe.hpp"

namespace pmoe::detail::inline PMOE_CUDA_FLAVOR::moe {
namespace {

using namespace ::pmoe::cuda;

constexpr int kLandedSlot = 0, kDoneSlot = 1, kCallSlot = 2, kSlots = 3;

class DeviceTpMoe final : public DeviceMoe {
 public:
  DeviceTpMoe(Communicator& comm, const MoeConfig& config, int max_tokens)
      : comm_(comm),
        config_(config),
        rank_(comm.rank()),
        world_(comm.size()),
        device_(comm.device()),
        stream_((set_device(comm.device()), static_cast<cudaStream_t>(comm.stream().handle))),
        timeout_ns_(uint64_t(comm.timeout_s() * 1e9)),
        timer_(cuda::DeviceLocalMoe::kPhases + 1),  // and the all-reduce
        moe_(config, max_tokens, comm.rank() * (config.ffn_dim / comm.size()),
             (comm.rank() + 1) * (config.ffn_dim / comm.size()), comm.device(), stream_) {
    memory_ = comm.alloc_symmetric(size_t(max_tokens) * config.out_dim() * sizeof(float), kSlots);
    std::vector<const float*> parts(static_cast<size_t>(world_));
    for (int q = 0; q < world_; ++q) {
      parts[size_t(q)] = reinterpret_cast<const float*>(memory_->peer(q));
      PMOE_CHECK(parts[size_t(q)] != nullptr, "TpMoe on ", device_.str(), ": rank ", q,
                 " is not load/store reachable from rank ", rank_,
                 "; the device all-reduce needs every rank on one node");
    }
    parts_ = Buffer(DType::i64, {world_}, device_);  // W device pointers
    copy(parts_, Tensor(parts.data(), DType::i64, {world_}));
    comm.barrier();  // every rank's memory and stream exist before any peer's first wait
  }
  ~DeviceTpMoe() override { (void)cudaStreamSynchronize(stream_); }

  void forward(const Tensor& x, const Tensor& y, MoeStats& stats) override {
    const int64_t n = x.size(0) * config_.out_dim();
    check_same_count(n);
    throw_if_faulted();
    timer_.start(stream_);
    uint64_t* call = memory_->signal_word(rank_, kCallSlot);
    count_call(call, stream_);
    for (int q = 0; q < world_; ++q)  // q may still be reading this rank's previous partial
      if (q != rank_)
        wait_for_signal(memory_->signal_word(q, kDoneSlot), call, 1, timeout_ns_, q, kWaitDone,
                        fault_.device(), stream_);
    moe_.forward(x, memory_->local(), DType::f32, stats, timer_);
    timer_.begin(&MoeStats::reduce_s, stream_);
    raise_signal(memory_->signal_word(rank_, kLandedSlot), call, stream_);
    for (int q = 0; q < world_; ++q)
      if (q != rank_)
        wait_for_signal(memory_->signal_word(q, kLandedSlot), call, 0, timeout_ns_, q, kWaitPiece,
                        fault_.device(), stream_);
    SumPartials sum;
    sum.parts = parts_.data<const float*>();
    sum.world = world_;
    sum.out = y.data();
    sum.n = n;
    launch_sum_partials(sum, config_.dtype, stream_);
    raise_signal(memory_->signal_word(rank_, kDoneSlot), call, stream_);
    timer_.end(stream_);
    stats.bytes_moved = (world_ - 1) * n * int64_t(sizeof(float));  // the peers' partials read
  }

  void finish_stats(MoeStats& stats) override { timer_.finish(stats); }
  size_t weight_bytes() const override { return moe_.weight_bytes(); }
  size_t workspace_bytes() const override {
    return moe_.workspace_bytes() + memory_->bytes() +
           size_t(memory_->signal_slots()) * SymmetricMemory::kSignalBytes + parts_.nbytes();
  }

 private:
  // Every rank sums n elements this call (the sum kernel reads n of each peer's region).
  void check_same_count(int64_t n) {
    const auto all = comm_.all_gather(std::as_bytes(std::span(&n, 1)));
    for (int q = 0; q < world_; ++q) {
      int64_t theirs;
      std::memcpy(&theirs, all.data() + size_t(q) * sizeof theirs, sizeof theirs);
      check_all_reduce_count("TpMoe::forward", q, theirs, rank_, n);
    }
  }

  // A wait of an earlier call timed out: the protocol is broken.
  void throw_if_faulted() const {
    const std::optional<OverlapFault> fault = fault_.read();
    if (!fault) return;
    throw Error(cat("TpMoe::forward on rank ", rank_, " (", device_.str(), "): rank ", fault->peer,
                    fault->what == kWaitDone ? " did not finish reading the previous partials"
                                      : " did not deliver its partial output",
                    " within ", timeout_ns_ / 1e9, " s; build a new layer"));
  }

  Communicator& comm_;  // outlives the layer (include/pmoe/moe.hpp)
  MoeConfig config_;
  int rank_, world_;
  Device device_;
  cudaStream_t stream_;
  uint64_t timeout_ns_;
  cuda::PhaseTimer timer_;
  cuda::DeviceLocalMoe moe_;
  std::unique_ptr<SymmetricMemory> memory_;
  Buffer parts_;  // [W] const float*: every rank's region, for the sum kernel
  FaultWord fault_;  // written by the waits, read at the next call's entry
};

}  // namespace

std::unique_ptr<DeviceMoe> make_tp(Communicator& comm, const MoeConfig& config, int max_tokens) {
  return std::make_unique<DeviceTpMoe>(comm, config, max_tokens);
}

}  // namespace pmoe::detail::inline PMOE_CUDA_FLAVOR::moe
