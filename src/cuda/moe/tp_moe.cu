// TpMoe on a device: every rank runs all tokens through its hidden slice of every expert
// (DeviceLocalMoe, local_moe.cuh), writing its f32 partial output straight into its own
// symmetric region; one all-reduce per forward then sums the W partials, on the rank's stream:
//
//   symmetric region of rank r:  partial [m, O] f32       (max_tokens x O)
//   signals of rank r:           landed = e   (r's partial of call e is in its region)
//                                done = e     (r has read every region for call e)
//                                call         (the call counter; no peer reads it)
//                                count = n    (the elements r sums in its latest call)
//
//   stream: call += 1 | wait every peer's done >= e - 1 | layer -> own region | count = n
//           | landed = e | wait every peer's landed >= e
//           | y = sum of the W regions in rank order, if every count is n | done = e
//
// Peers' regions are read with loads (one node: symmetric memory is load/store reachable), summed
// in rank order in f32 and rounded once, so every rank gets the same bits (as on the CPU). A rank
// writes only its own memory; the done words keep it from overwriting a region a peer still
// reads. Waits are bounded (PMOE_TIMEOUT_S); a timed-out wait is raised at the next call's entry.
// Nothing waits on the host, so a forward can be captured in a CUDA graph.
//
// Ranks given different token counts are found on the device, with no host round trip: the sum
// kernel compares every rank's published count with its own and, on a mismatch, sums nothing and
// records it in host-mapped memory (CountMismatch). Every signal still moves, so the protocol
// holds; the next forward raises the CPU layer's pmoe::Error (core/arg_checks.hpp) at entry,
// once, before it launches anything, and the layer goes on (as AllToAll's bad-index errors).

#include <memory>
#include <vector>

#include "backends/moe_backend.hpp"
#include "core/arg_checks.hpp"
#include "core/device_runtime.hpp"
#include "cuda/check.hpp"
#include "cuda/flavor.hpp"
#include "cuda/moe/local_moe.cuh"
#include "cuda/overlap/signals.cuh"

namespace pmoe::detail::inline PMOE_CUDA_FLAVOR::moe {
namespace {

using namespace ::pmoe::cuda;

constexpr int kLandedSlot = 0, kDoneSlot = 1, kCallSlot = 2, kCountSlot = 3, kSlots = 4;

class DeviceTpMoe final : public MoeBackend {
 public:
  DeviceTpMoe(Communicator& comm, const MoeConfig& config, int max_tokens)
      : config_(config),
        rank_(comm.rank()),
        world_(comm.size()),
        device_(comm.device()),
        stream_((set_device(comm.device()), static_cast<cudaStream_t>(comm.stream().handle))),
        timeout_ns_(uint64_t(comm.timeout_s() * 1e9)),
        timer_(cuda::DeviceLocalMoe::kPhases + 1, config.device_stats),  // and the all-reduce
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
    std::vector<const uint64_t*> counts(static_cast<size_t>(world_));
    for (int q = 0; q < world_; ++q) counts[size_t(q)] = memory_->signal_word(q, kCountSlot);
    counts_ = Buffer(DType::i64, {world_}, device_);
    copy(counts_, Tensor(counts.data(), DType::i64, {world_}));
    comm.barrier();  // every rank's memory and stream exist before any peer's first wait
  }
  ~DeviceTpMoe() override { (void)cudaStreamSynchronize(stream_); }

  void forward(const Tensor& x, const Tensor& y, MoeStats& stats) override {
    const int64_t n = x.size(0) * config_.out_dim();
    throw_if_faulted();
    throw_if_counts_differed();
    timer_.start(stream_);
    uint64_t* call = memory_->signal_word(rank_, kCallSlot);
    count_call(call, stream_);
    for (int q = 0; q < world_; ++q)  // q may still be reading this rank's previous partial
      if (q != rank_)
        wait_for_signal(memory_->signal_word(q, kDoneSlot), call, 1, timeout_ns_, q, kWaitDone,
                        fault_.device(), stream_);
    moe_.forward(x, memory_->local(), DType::f32, stats, timer_);
    timer_.begin(&MoeStats::reduce_s, stream_);
    launch_publish_count(memory_->signal_word(rank_, kCountSlot), n, stream_);
    raise_signal(memory_->signal_word(rank_, kLandedSlot), call, stream_);
    for (int q = 0; q < world_; ++q)
      if (q != rank_)
        wait_for_signal(memory_->signal_word(q, kLandedSlot), call, 0, timeout_ns_, q, kWaitPiece,
                        fault_.device(), stream_);
    SumPartials sum;
    sum.parts = parts_.data<const float*>();
    sum.counts = counts_.data<const uint64_t*>();
    sum.mismatch = mismatch_.device();
    sum.world = world_;
    sum.out = y.data();
    sum.n = n;
    launch_sum_partials(sum, config_.dtype, stream_);
    raise_signal(memory_->signal_word(rank_, kDoneSlot), call, stream_);
    timer_.end(stream_);
    stats.bytes_moved = (world_ - 1) * n * int64_t(sizeof(float));  // the peers' partials read
  }

  void finish_stats(MoeStats& stats) override {
    timer_.finish(stats);
    moe_.finish_stats(stats);
  }
  size_t weight_bytes() const override { return moe_.weight_bytes(); }
  size_t workspace_bytes() const override {
    return moe_.workspace_bytes() + memory_->bytes() +
           size_t(memory_->signal_slots()) * SymmetricMemory::kSignalBytes + parts_.nbytes();
  }

 private:
  // An earlier call's sum kernel found a rank with another element count (it summed nothing):
  // raised once, here; the protocol is intact, so the layer goes on.
  void throw_if_counts_differed() {
    const std::optional<CountMismatch> seen = mismatch_.take();
    if (!seen) return;
    check_all_reduce_count("TpMoe::forward (an earlier call, found on the device)", seen->peer,
                           seen->theirs, rank_, seen->mine);
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

  MoeConfig config_;
  int rank_, world_;
  Device device_;
  cudaStream_t stream_;
  uint64_t timeout_ns_;
  cuda::PhaseTimer timer_;
  cuda::DeviceLocalMoe moe_;
  std::unique_ptr<SymmetricMemory> memory_;
  Buffer parts_;   // [W] const float*: every rank's region, for the sum kernel
  Buffer counts_;  // [W] const uint64_t*: every rank's count word, for the sum kernel
  CountMismatchRecord mismatch_;  // written by the sum kernel
  FaultWord fault_;  // written by the waits, read at the next call's entry
};

}  // namespace

std::unique_ptr<MoeBackend> make_tp(Communicator& comm, const MoeConfig& config, int max_tokens) {
  return std::make_unique<DeviceTpMoe>(comm, config, max_tokens);
}

}  // namespace pmoe::detail::inline PMOE_CUDA_FLAVOR::moe
