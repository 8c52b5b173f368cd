// EpMoe on a device: route on the rank's stream, AllToAll dispatch, the local experts as GEMMs
// over tiles of the received rows (device_experts.hpp), AllToAll combine. Nothing reads the
// counts on the host, so the tiles are planned for the most rows a rank can receive, R
// min(k, E_local) a micro-batch: below every slot (E_local R) only where E_local > k. bf16
// layers compute the live tiles only (the grouped GEMM reads their count on the device); f32
// layers' cuBLAS batch computes the whole plan.
//
// Buffers per rank (C = tokens per micro-batch, R = W * C slots per local expert, wire =
// max(H, O) as on the CPU):
//
//   y_wire            [max_tokens, wire] dtype   staging, only where O < wire
//   expert_x[b]       [E_local, R, wire] dtype   dispatch's output for micro-batch b
//   expert_y[b]       [E_local, R, wire] dtype   the experts' outputs, cols [0, O): exchange
//                                                b's expert output buffer (in place)
//
// The exchanges run on their in-place buffers (AllToAllConfig::in_place_buffers): the experts
// write their outputs into exchange b's expert output buffer, where combine's sources read them,
// so each row crosses once (docs/gpu-all-to-all.md, "Each byte once"). Where H < wire the tokens
// are staged at the wire width into exchange b's input buffer, which dispatch's receivers read in
// place; otherwise dispatch sends the caller's x (a copy into the input buffer would cost what it
// saves).
//   hidden, out       [E_local, R, gF] / [E_local, R, O] f32, shared by the batches
//   act               [E_local, R, F] dtype      bf16 models only (f32: in place in hidden)
//
// The expert GEMMs read expert_x as dispatch left it (the model's dtype: bf16 on tensor cores).
// Their plan is sized for the most rows a rank can receive; the tile size for the rows it
// receives on average, R k / W (device_experts.hpp).
//
// micro_batches = 2 puts the experts on a second stream (the communicator's side_stream()) so
// that one half's exchange runs beside the other half's GEMMs:
//
//   main:    route | d(A).send d(B).send d(A).recv -ev-> d(B).recv  <-ev- c(A).send -ev->
//            c(A).recv <-ev- c(B).send c(B).recv
//   experts:                    experts(A) ----------^            experts(B) ---^
//
// Each half has its own expert_x / expert_y (d(B).recv writes while experts(A) reads); the f32
// workspace is shared, since the expert stream runs the halves one after the other.
//
// With MoeConfig::device_stats only (otherwise none of this runs): MoeStats::bytes_moved from a
// one-block kernel after the router that counts the routing's traffic (moe/ep_traffic.hpp, the
// CPU layer's rule) into host-mapped memory, the rows in use from the tile plans, and the phase
// times from events around each exchange call and each batch's experts, on the stream that runs
// them (phase_timer.hpp; with two micro-batches, experts overlap exchanges). last_stats() waits
// for an event recorded at the end of the forward.
#include <algorithm>
#include <memory>
#include <vector>

#include "backends/moe_backend.hpp"
#include "core/device_runtime.hpp"
#include "cuda/check.hpp"
#include "cuda/flavor.hpp"
#include "cuda/moe/device_experts.hpp"
#include "cuda/moe/device_router.hpp"
#include "cuda/moe/phase_timer.hpp"
#include "moe/expert_slots.hpp"
#include "pmoe/all_to_all.hpp"

namespace pmoe::detail::inline PMOE_CUDA_FLAVOR::moe {
namespace {

using namespace ::pmoe::cuda;

class DeviceEpMoe final : public MoeBackend {
 public:
  DeviceEpMoe(Communicator& comm, const MoeConfig& config, int max_tokens,
              const EpMoeOptions& options)
      : config_(config),
        rank_(comm.rank()),
        world_(comm.size()),
        num_local_(slot_count(config, options.placement) / comm.size()),
        wire_(std::max(config.hidden_dim, config.out_dim())),
        per_batch_((max_tokens + options.micro_batches - 1) / options.micro_batches),
        micro_batches_(options.micro_batches),
        counts_logical_rows_(options.placement.empty() && !options.rank_mask &&
                             options.on_peer_loss == OnPeerLoss::fail),
        main_((set_device(comm.device()), static_cast<cudaStream_t>(comm.stream().handle))),
        experts_stream_(micro_batches_ == 2
                            ? static_cast<cudaStream_t>(comm.side_stream().handle)
                            : main_),
        timer_(1 + 5 * micro_batches_, config.device_stats),  // route; a batch: 2 + 1 + 2
        router_(config, max_tokens, comm.device()),
        experts_(config, rank_experts(config, options.placement, comm.rank(), comm.size()), 0,
                 config.ffn_dim, max_rows(), comm.device(), micro_batches_) {
    const int micro_batches = micro_batches_;
    // Before the AllToAlls' collective construction: page-locking may wait for the whole device,
    // where a peer past it could already be waiting in its first forward for this rank.
    if (config.device_stats) {
      PMOE_CUDA_CHECK(cudaHostAlloc(&rows_moved_, sizeof(int64_t), cudaHostAllocMapped));
      PMOE_CUDA_CHECK(
          cudaHostGetDevicePointer(reinterpret_cast<void**>(&rows_moved_device_), rows_moved_, 0));
      PMOE_CUDA_CHECK(cudaEventCreateWithFlags(&counted_, cudaEventDisableTiming));
    }
    const Device device = comm.device();
    const int H = config.hidden_dim, O = config.out_dim(), k = config.top_k;
    const int64_t R = slots();
    if (config.dtype != DType::f32) x_f32_ = Buffer(DType::f32, {max_tokens, H}, device);
    if (O < wire_) y_wire_ = Buffer(config.dtype, {max_tokens, wire_}, device);
    indices_ = Buffer(DType::i32, {max_tokens, k}, device);
    weights_ = Buffer(DType::f32, {max_tokens, k}, device);
    counts_ = Buffer(DType::i32, {micro_batches, num_local_}, device);
    for (int b = 0; b < micro_batches; ++b) {
      expert_x_.emplace_back(config.dtype, std::initializer_list<int64_t>{num_local_, R, wire_},
                             device);
    }
    hidden_ = Buffer(DType::f32, {num_local_, R, experts_.hidden_ld()}, device);
    if (experts_.separate_act()) act_ = Buffer(config.dtype, {num_local_, R, experts_.width()}, device);
    out_ = Buffer(DType::f32, {num_local_, R, O}, device);
    const AllToAllConfig a2a = ep_exchange_config(config, options, per_batch_, wire_, true);
    for (int b = 0; b < micro_batches; ++b) {
      exchanges_.push_back(std::make_unique<AllToAll>(comm, a2a));
      expert_y_.push_back(exchanges_.back()->expert_output_buffer());
    }
    PMOE_CUBLAS_CHECK(cublasCreate(&router_blas_));
    PMOE_CUBLAS_CHECK(cublasSetStream(router_blas_, main_));
    PMOE_CUBLAS_CHECK(cublasCreate(&experts_blas_));
    PMOE_CUBLAS_CHECK(cublasSetStream(experts_blas_, experts_stream_));
    for (cudaEvent_t* e : {&to_experts_[0], &to_experts_[1], &from_experts_[0], &from_experts_[1]})
      PMOE_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  ~DeviceEpMoe() override {
    (void)cudaStreamSynchronize(experts_stream_);
    (void)cudaStreamSynchronize(main_);
    (void)cublasDestroy(router_blas_);
    (void)cublasDestroy(experts_blas_);
    for (cudaEvent_t e :
         {to_experts_[0], to_experts_[1], from_experts_[0], from_experts_[1], counted_})
      if (e) (void)cudaEventDestroy(e);
    if (rows_moved_) (void)cudaFreeHost(rows_moved_);
  }

  void change_membership(const std::function<void(AllToAll&)>& change) override {
    for (auto& exchange : exchanges_) change(*exchange);
  }
  const AllToAll& exchange() const override { return *exchanges_.front(); }

  void forward(const Tensor& x, const Tensor& y, MoeStats& stats) override {
    const int m = int(x.size(0)), H = config_.hidden_dim, O = config_.out_dim();
    const size_t elem = dtype_size(config_.dtype);
    stats.tokens = m;
    stats.router_flops = router_.flops(m);
    // Issued: the most the GEMMs can compute; with device stats, finish_stats() puts their count.
    stats.expert_rows =
        micro_batches_ * experts_.tile_plan(slots(), max_rows(), expected_rows()).rows();
    stats.expert_flops = experts_.flops(stats.expert_rows);

    // Route, and stage the tokens at the wire width.
    timer_.start(main_);
    timer_.begin(&MoeStats::route_s, main_);
    const float* xf = rows_as_f32(x.data(), config_.dtype, m, H, x_f32_.data<float>(), main_);
    router_.route(router_blas_, main_, m, xf, indices_.data<int32_t>(), weights_.data<float>());
    if (config_.device_stats && counts_logical_rows_) count_rows_moved(m);
    std::byte* y_recv = static_cast<std::byte*>(y.data());
    if (O < wire_) y_recv = y_wire_.data<std::byte>();
    // The batches' rows: [0, half) and [half, m) with two micro-batches.
    const int half = micro_batches_ == 1 ? m : (m + 1) / 2;
    std::byte* x_send[2] = {static_cast<std::byte*>(x.data()),
                            static_cast<std::byte*>(x.data()) + size_t(half) * H * elem};
    for (int b = 0; H < wire_ && b < micro_batches_; ++b) {
      const int begin = b == 0 ? 0 : half, end = b == 0 ? half : m;
      CopyRows c;
      c.src = static_cast<std::byte*>(x.data()) + size_t(begin) * H * elem;
      c.src_ld = H;
      c.dst = exchanges_[size_t(b)]->input_buffer().data();
      c.dst_ld = wire_;
      c.rows = end - begin;
      c.copy_cols = H;
      c.dst_cols = wire_;
      launch_copy_rows(c, int(elem), main_);
      x_send[b] = static_cast<std::byte*>(c.dst);
    }
    timer_.end(main_);

    if (micro_batches_ == 1) {
      const Batch all = batch(0, 0, m, x_send[0], y_recv);
      dispatch(all, Phase::both);
      run_experts(all);
      combine(all, Phase::both);
    } else {
      const Batch a = batch(0, 0, half, x_send[0], y_recv),
                  b = batch(1, half, m, x_send[1], y_recv);
      dispatch(a, Phase::send);
      dispatch(b, Phase::send);
      dispatch(a, Phase::recv);
      start_experts(a);
      dispatch(b, Phase::recv);
      finish_experts(a);
      combine(a, Phase::send);
      start_experts(b);
      combine(a, Phase::recv);
      finish_experts(b);
      combine(b, Phase::send);
      combine(b, Phase::recv);
    }

    stats.expert_gemm = experts_.gemm_path();
    if (O < wire_ && m > 0) {
      CopyRows c;
      c.src = y_wire_.data<void>();
      c.src_ld = wire_;
      c.dst = y.data();
      c.dst_ld = O;
      c.rows = m;
      c.copy_cols = O;
      c.dst_cols = O;
      launch_copy_rows(c, int(elem), main_);
    }
    if (count_pending_) PMOE_CUDA_CHECK(cudaEventRecord(counted_, main_));  // all of the above
  }

  void finish_stats(MoeStats& stats) override {
    timer_.finish(stats);
    if (!count_pending_) return;
    count_pending_ = false;
    PMOE_CUDA_CHECK(cudaEventSynchronize(counted_));
    stats.bytes_moved = *rows_moved_ * wire_ * int64_t(dtype_size(config_.dtype));
    const DeviceExperts::RowTally t = experts_.tally(micro_batches_);
    stats.expert_rows_used = t.used;
    stats.expert_rows_live = t.live;
    stats.expert_rows = t.issued;
    stats.expert_flops = experts_.flops(t.issued);
  }

  size_t weight_bytes() const override { return router_.weight_bytes() + experts_.weight_bytes(); }
  size_t workspace_bytes() const override {
    size_t bytes = router_.workspace_bytes() + experts_.workspace_bytes() + x_f32_.nbytes() +
                   y_wire_.nbytes() + indices_.nbytes() + weights_.nbytes() +
                   counts_.nbytes() + hidden_.nbytes() + act_.nbytes() + out_.nbytes();
    for (const Buffer& b : expert_x_) bytes += b.nbytes();
    // expert_y: the exchanges' in-place buffers, in their workspace.
    for (const auto& exchange : exchanges_) bytes += exchange->workspace_bytes();
    return bytes;
  }

 private:
  struct Batch {
    int index;
    Tensor x, indices, weights, y;  // the batch's rows of the wire input, routing and output
  };

  int64_t slots() const { return int64_t(world_) * per_batch_; }
  // The most rows a micro-batch can bring this rank's experts: each of the R tokens that can
  // arrive goes to at most min(k, E_local) of them.
  int64_t max_rows() const { return slots() * std::min(config_.top_k, num_local_); }
  // What a micro-batch brings on average under uniform routing: R k E_local / E = R k / W.
  int64_t expected_rows() const { return std::max<int64_t>(1, slots() * config_.top_k / world_); }
  int32_t* batch_counts(const Batch& b) const {
    return counts_.data<int32_t>() + b.index * num_local_;
  }

  // Batch `index`: rows [begin, end) of the layer, whose wire input starts at x_send.
  Batch batch(int index, int begin, int end, std::byte* x_send, std::byte* y_recv) const {
    const int n = end - begin, k = config_.top_k;
    const size_t row_bytes = size_t(wire_) * dtype_size(config_.dtype);
    const Device device = indices_.tensor().device();
    return {index, Tensor(x_send, config_.dtype, {n, wire_}, device),
            Tensor(indices_.data<int32_t>() + int64_t(begin) * k, DType::i32, {n, k}, device),
            Tensor(weights_.data<float>() + int64_t(begin) * k, DType::f32, {n, k}, device),
            Tensor(y_recv + size_t(begin) * row_bytes, config_.dtype, {n, wire_}, device)};
  }

  void dispatch(const Batch& b, Phase phase) {
    const Device device = indices_.tensor().device();
    timer_.begin(&MoeStats::dispatch_s, main_);
    exchanges_[size_t(b.index)]->dispatch(b.x, Tensor(), b.indices,
                                          Tensor(batch_counts(b), DType::i32, {num_local_}, device),
                                          expert_x_[size_t(b.index)], Tensor(), phase);
    timer_.end(main_);
  }

  void combine(const Batch& b, Phase phase) {
    timer_.begin(&MoeStats::combine_s, main_);
    exchanges_[size_t(b.index)]->combine(expert_y_[size_t(b.index)], b.indices, b.weights, b.y,
                                         phase);
    timer_.end(main_);
  }

  // The call's traffic in rows, counted on the main stream after the router (device stats). A
  // captured forward leaves it to its replays: last_stats() then has no count to wait for.
  void count_rows_moved(int m) {
    CountEpRows c;
    c.indices = indices_.data<int32_t>();
    c.rows = rows_moved_device_;
    c.m = m;
    c.top_k = config_.top_k;
    c.num_experts = config_.num_experts;
    c.num_local = num_local_;
    c.rank = rank_;
    launch_count_ep_rows(c, main_);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    PMOE_CUDA_CHECK(cudaStreamIsCapturing(main_, &capture));
    count_pending_ = capture == cudaStreamCaptureStatusNone;
  }

  // The experts of batch b on the expert stream, after what the main stream holds (its
  // dispatch(recv)).
  void start_experts(const Batch& b) {
    PMOE_CUDA_CHECK(cudaEventRecord(to_experts_[b.index], main_));
    PMOE_CUDA_CHECK(cudaStreamWaitEvent(experts_stream_, to_experts_[b.index], 0));
    run_experts(b);
    PMOE_CUDA_CHECK(cudaEventRecord(from_experts_[b.index], experts_stream_));
  }
  // The main stream goes on (to batch b's combine) once its experts are done.
  void finish_experts(const Batch& b) {
    PMOE_CUDA_CHECK(cudaStreamWaitEvent(main_, from_experts_[b.index], 0));
  }

  // Every local expert over all R slots of batch b, on the expert stream.
  void run_experts(const Batch& b) {
    const int O = config_.out_dim();
    const int64_t R = slots();
    const int32_t* counts = batch_counts(b);
    timer_.begin(&MoeStats::experts_s, experts_stream_);
    experts_.run(experts_blas_, experts_stream_, int(R), max_rows(), expected_rows(),
                 expert_x_[size_t(b.index)].data<void>(), wire_, hidden_.data<float>(),
                 act_.data<void>(), out_.data<float>(), counts, b.index);
    NarrowRows n;
    n.src = out_.data<float>();
    n.src_ld = O;
    n.dst = expert_y_[size_t(b.index)].data<void>();
    n.dst_ld = wire_;
    n.rows = num_local_ * R;
    n.cols = O;
    n.row_limits = counts;
    n.group_rows = R;
    launch_narrow_rows(n, config_.dtype, experts_stream_);
    timer_.end(experts_stream_);
  }

  MoeConfig config_;
  int rank_, world_, num_local_, wire_, per_batch_, micro_batches_;
  // The traffic count reads the router's indices as slots: not with a placement or a mask, whose
  // routing happens inside the exchange (MoeStats::bytes_moved stays 0 there).
  bool counts_logical_rows_;
  cudaStream_t main_, experts_stream_;
  cublasHandle_t router_blas_ = nullptr, experts_blas_ = nullptr;
  cudaEvent_t to_experts_[2] = {}, from_experts_[2] = {}, counted_ = nullptr;
  PhaseTimer timer_;
  int64_t* rows_moved_ = nullptr;         // device stats, host-mapped: the call's traffic in rows
  int64_t* rows_moved_device_ = nullptr;  // the same word, as the kernel addresses it
  bool count_pending_ = false;            // a forward's count that finish_stats has not read
  DeviceRouter router_;
  DeviceExperts experts_;
  std::vector<std::unique_ptr<AllToAll>> exchanges_;  // one per micro-batch
  Buffer x_f32_, y_wire_, indices_, weights_, counts_, hidden_, act_, out_;
  std::vector<Buffer> expert_x_;
  std::vector<Tensor> expert_y_;  // exchange b's expert output buffer
};

}  // namespace

std::unique_ptr<MoeBackend> make_ep(Communicator& comm, const MoeConfig& config, int max_tokens,
                                    const EpMoeOptions& options) {
  return std::make_unique<DeviceEpMoe>(comm, config, max_tokens, options);
}

}  // namespace pmoe::detail::inline PMOE_CUDA_FLAVOR::moe
