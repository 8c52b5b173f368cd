// AllToAll's CUDA backend: allocates the symmetric region (src/all_to_all/layout.hpp, every
// backend's layout) and the
// private scratch, fills one AllToAllParams per call and launches the kernels on the rank's
// stream. Nothing here waits for the device, so dispatch + combine can be captured in a graph.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include <unistd.h>

#include <cuda/atomic>

#include "backends/all_to_all_backend.hpp"
#include "all_to_all/loss_board.hpp"
#include "all_to_all/slot_table.hpp"
#include "core/device_runtime.hpp"
#include "all_to_all/layout.hpp"
#include "all_to_all/step.hpp"
#include "cuda/all_to_all/error_text.hpp"
#include "cuda/all_to_all/kernels.hpp"
#include "cuda/all_to_all/peer_loss.hpp"
#include "cuda/check.hpp"
#include "cuda/flavor.hpp"
#include "cuda/launch.cuh"
#include "cuda/sm_count.hpp"
#include "cuda/transport/remote_setup.hpp"
#include "comm/group.hpp"
#include "comm/node_split.hpp"

namespace pmoe::detail::inline PMOE_CUDA_FLAVOR {
namespace {

using cuda::AllToAllParams;

class CudaAllToAll final : public AllToAllBackend {
 public:
  CudaAllToAll(Communicator& comm, const AllToAllConfig& config)
      : comm_(comm),
        config_(config),
        layout_(config, comm.size()),
        device_(comm.device()),
        stream_(static_cast<cudaStream_t>(comm.stream().handle)) {
    PMOE_CHECK(comm.size() <= cuda::kMaxRanks, "AllToAll on CUDA: at most ", cuda::kMaxRanks,
               " ranks, got ", comm.size());
    PMOE_CHECK(!config.packed_expert_rows, "AllToAll on CUDA: packed_expert_rows is a layout of "
               "the CPU backend; on CUDA the rows of expert e are rows [0, expert_num_tokens[e]) "
               "of its own block");
    memory_ = cuda::alloc_transport_memory(comm, layout_.total_bytes, layout_.signal_slots(),
                                           config.ranks_per_node, stream_);
    remote_ = std::make_unique<cuda::RemoteSetup>(*memory_, AllToAllLayout::kSignalWords, stream_);
    // Counted after a barrier (every rank of this process has made its stream) and agreed on
    // (the largest count), so that every rank decides alike even as failing ones leave.
    comm.barrier();
    int streams = streams_on(device_);
    const auto counts = comm.all_gather(std::as_bytes(std::span(&streams, 1)));
    for (size_t r = 0; r < counts.size() / sizeof streams; ++r)
      streams = std::max(streams, reinterpret_cast<const int*>(counts.data())[r]);
    const int queues = device_max_connections();
    PMOE_CHECK(streams <= queues, "AllToAll on ", device_.str(), ": ", streams, " streams of this "
               "process share the device, but CUDA_DEVICE_MAX_CONNECTIONS is ", queues, "; streams "
               "beyond it share hardware queues, where a rank's kernel can wait behind a peer's "
               "spinning one for ever. Set CUDA_DEVICE_MAX_CONNECTIONS >= ", streams, " before CUDA "
               "starts (pmoe sets 32 where it is unset)");
    const int W = comm.size(), L = config.num_experts / W;
    const size_t max_routes = size_t(W) * config.max_tokens * layout_.max_pairs;

    AllToAllParams& p = params_;
    p = AllToAllParams{};
    static_cast<MoeShape&>(p) = config.shape();
    p.rank = comm.rank();
    p.world_size = W;
    p.num_local_experts = L;
    p.scales_per_token = config.scales_per_token();
    p.rows_per_expert = int64_t(W) * config.max_tokens;
    p.in_elem_bytes = dtype_size(config.in_dtype);
    p.out_dtype = int(config.out_dtype);
    p.layout = layout_;
    // Node sums return rows through relays, never in place.
    p.row_refs = config.in_place_buffers && !layout_.node_sum;
    for (int r = 0; r < W; ++r) {
      p.regions[r] = memory_->peer(r);  // null for a peer on another node
      p.signals[r] = p.regions[r] ? memory_->signal_word(r, 0) : nullptr;
    }
    if (layout_.hierarchical) {  // a relay forwards to its node's ranks by load/store
      const int R = layout_.ranks_per_node, first = p.rank / R * R;
      for (int r = first; r < first + R; ++r)
        PMOE_CHECK(p.regions[r], "AllToAll on CUDA: cross_node = hierarchical needs every rank of "
                   "a node to reach the others by load/store, but rank ", r, " (node ", r / R,
                   " for ranks_per_node = ", R, ") is not reachable from rank ", p.rank,
                   "; set ranks_per_node to the ranks that share a machine");
    }
    cuda::Transport& t = p.transport;
    t.rank = p.rank;
    t.world_size = W;
    t.ranks_per_node = ranks_per_node();
    for (int r = 0; r < W; ++r) {
      t.direct[r] = p.regions[r];
      t.direct_signals[r] = p.signals[r];
    }
    t.local_signals = memory_->signal_word(p.rank, 0);
    t.signal_stride = int(AllToAllLayout::kSignalWords);
    t.same_device = every_peer_on_this_device(comm);
    t.remote = remote_->path();
    t.remote_baseline = remote_->baseline();
    // Private scratch, one allocation.
    scratch_bytes_ = 0;
    auto reserve = [&](size_t bytes) {
      const size_t at = scratch_bytes_;
      scratch_bytes_ += (bytes + 255) / 256 * 256;
      return at;
    };
    const size_t send_slot = reserve(sizeof(int32_t) * config.max_tokens * W);
    const size_t send_position =
        reserve(sizeof(int32_t) * config.max_tokens * config.top_k);
    const size_t send_count = reserve(sizeof(int32_t) * W);
    const size_t send_expert_count = reserve(sizeof(int32_t) * config.num_experts);
    const size_t relay_slot = reserve(sizeof(int32_t) * config.max_tokens * layout_.nodes);
    const size_t relay_count = reserve(sizeof(int32_t) * layout_.nodes);
    const size_t relay_tally = reserve(sizeof(int32_t) * layout_.nodes);
    const size_t recv_base = reserve(sizeof(int32_t) * W * L);
    const size_t route_base = reserve(sizeof(int32_t) * L);
    const size_t source_end = reserve(sizeof(int32_t) * W);
    const size_t slot_count = reserve(sizeof(int32_t));
    const size_t send_first_bad = reserve(sizeof(int32_t));
    const size_t routes = reserve(sizeof(cuda::Route) * max_routes);
    const size_t route_count = reserve(sizeof(int32_t));
    const size_t epoch = reserve(sizeof(uint64_t));
    const size_t counters = reserve(sizeof(uint32_t) * cuda::kBlockCounters);
    const size_t error = reserve(sizeof(cuda::ErrorWord));
    error_at_ = error;
    const size_t owners_ready = reserve(sizeof(int32_t));
    const size_t round = reserve(sizeof(cuda::Round));  // zeroed: dispatch(send) comes first
    // i64 indices narrowed for the kernels, one copy per op: combine's must outlive dispatch's.
    const size_t index_count = size_t(config.max_tokens) * config.top_k;
    const size_t dispatch_indices = reserve(sizeof(int32_t) * index_count);
    calls_state_end_ = dispatch_indices;  // what a call leaves in scratch lies before this
    const size_t combine_indices = reserve(sizeof(int32_t) * index_count);
    // A placement's or a mask's routing (set_routing): the slot table, the live ranks, and
    // combine's weights after the mask.
    const size_t table_first = reserve(sizeof(int32_t) * (config.num_experts + 1));
    const size_t table_slots = reserve(sizeof(int32_t) * config.num_experts);
    const size_t live = reserve(sizeof(int32_t) * W);
    const size_t combine_weights = reserve(sizeof(float) * index_count);
    PMOE_CUDA_CHECK(cudaMalloc(&scratch_, scratch_bytes_));
    PMOE_CUDA_CHECK(cudaMemset(scratch_, 0, scratch_bytes_));
    auto* base = static_cast<std::byte*>(scratch_);
    p.send_slot = reinterpret_cast<int32_t*>(base + send_slot);
    p.send_position = reinterpret_cast<int32_t*>(base + send_position);
    p.send_count = reinterpret_cast<int32_t*>(base + send_count);
    p.send_expert_count = reinterpret_cast<int32_t*>(base + send_expert_count);
    p.relay_slot = reinterpret_cast<int32_t*>(base + relay_slot);
    p.relay_count = reinterpret_cast<int32_t*>(base + relay_count);
    p.relay_tally = reinterpret_cast<int32_t*>(base + relay_tally);
    p.recv_base = reinterpret_cast<int32_t*>(base + recv_base);
    p.route_base = reinterpret_cast<int32_t*>(base + route_base);
    p.source_end = reinterpret_cast<int32_t*>(base + source_end);
    p.slot_count = reinterpret_cast<int32_t*>(base + slot_count);
    p.send_first_bad = reinterpret_cast<int32_t*>(base + send_first_bad);
    p.routes = reinterpret_cast<cuda::Route*>(base + routes);
    p.route_count = reinterpret_cast<int32_t*>(base + route_count);
    p.epoch = reinterpret_cast<uint64_t*>(base + epoch);
    p.block_counters = reinterpret_cast<uint32_t*>(base + counters);
    p.error = reinterpret_cast<cuda::ErrorWord*>(base + error);
    p.owners_ready = reinterpret_cast<int32_t*>(base + owners_ready);
    p.round = reinterpret_cast<cuda::Round*>(base + round);
    dispatch_indices_ = reinterpret_cast<int32_t*>(base + dispatch_indices);
    combine_indices_ = reinterpret_cast<int32_t*>(base + combine_indices);
    table_first_ = reinterpret_cast<int32_t*>(base + table_first);
    table_slots_ = reinterpret_cast<int32_t*>(base + table_slots);
    live_ = reinterpret_cast<int32_t*>(base + live);
    combine_weights_ = reinterpret_cast<float*>(base + combine_weights);
    routes_slots_ = !config.placement.empty() || config.maskable();
    p.live = config.maskable() ? live_ : nullptr;
    // The error word's mirror, then (on_peer_loss = mask) the abort word, host-mapped.
    PMOE_CUDA_CHECK(cudaHostAlloc(&error_host_, sizeof(cuda::ErrorWord) + 64, cudaHostAllocMapped));
    std::memset(error_host_, 0, sizeof(cuda::ErrorWord) + 64);
    cuda::ErrorWord* mirror = nullptr;
    PMOE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&mirror), error_host_, 0));
    PMOE_CUDA_CHECK(cudaMemcpy(&p.error->host_mirror, &mirror, sizeof mirror,
                               cudaMemcpyHostToDevice));
    if (config.on_peer_loss == OnPeerLoss::mask) {
      auto* abort_host = reinterpret_cast<int32_t*>(static_cast<cuda::ErrorWord*>(error_host_) + 1);
      int32_t* abort_device = reinterpret_cast<int32_t*>(mirror + 1);
      PMOE_CUDA_CHECK(cudaMemcpy(&p.error->abort, &abort_device, sizeof abort_device,
                                 cudaMemcpyHostToDevice));
      loss_ = std::make_unique<DevicePeerLoss>(abort_host);
    }
    // The memset and the copy ran on the legacy stream, which the rank's non-blocking stream does
    // not wait for, and a copy from pageable memory may still be in flight when cudaMemcpy
    // returns: wait for both before any kernel can read the scratch.
    PMOE_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    // With on_peer_loss = mask a wait ends at the peer timeout: the peer is then a suspect.
    p.timeout_ns = uint64_t(
        (loss_ && config.peer_timeout_s > 0 ? config.peer_timeout_s : comm.timeout_s()) * 1e9);
    const int sms = cuda::sm_count(device_.index);
    // Ranks that share a GPU share its SMs: each launches its share of the grid. Their grids
    // then run side by side in one wave, where whole grids each would queue behind each other
    // in W waves (DeepEP gives each rank a number of SMs the same way).
    blocks_ = std::max(1, cuda::grid_blocks(sms) / (t.same_device ? W : 1));
    // The allocations above (page-locking above all) may synchronise the device. A rank that
    // finished first and already spins in its first dispatch would then wait for this rank,
    // which waits for the device: nobody launches until everybody is built.
    comm.barrier();
  }

  ~CudaAllToAll() override {
    loss_.reset();  // first: its watcher thread writes the abort word, in error_host_
    if (scratch_) (void)cudaFree(scratch_);
    if (error_host_) (void)cudaFreeHost(error_host_);
  }

  AllToAll::RemoteTraffic remote_traffic() const override { return remote_->traffic(); }
  int64_t arriving_rows() override {  // the front end asks only with packed rows, refused here
    throw Error("AllToAll::arriving_rows on CUDA: packed_expert_rows is a layout of the CPU "
                "backend");
  }
  size_t workspace_bytes() const override {
    return layout_.total_bytes + size_t(layout_.signal_slots()) * SymmetricMemory::kSignalBytes +
           scratch_bytes_;
  }
  Tensor input_buffer() const override {
    if (!config_.in_place_buffers) return {};
    return Tensor(region() + layout_.input_offset, config_.in_dtype,
                  {config_.max_tokens, config_.hidden_dim}, device_);
  }
  Tensor input_scale_buffer() const override {
    if (!config_.in_place_buffers || config_.in_dtype != DType::f8e4m3) return {};
    return Tensor(region() + layout_.input_scale_offset, DType::f32,
                  {config_.max_tokens, config_.scales_per_token()}, device_);
  }
  Tensor expert_output_buffer() const override {
    if (!config_.in_place_buffers) return {};
    return Tensor(region() + layout_.expert_output_offset, config_.out_dtype,
                  {params_.num_local_experts, params_.rows_per_expert, config_.hidden_dim},
                  device_);
  }

  // A fatal error (a peer that never arrived, a dtype mismatch) stays: the protocol is broken
  // and the op is retired. A non-fatal one (a bad index or bound_m, which every rank got past) is
  // raised once: its record is cleared here, and on the device before the next launch.
  void check_errors() const override {
    check_loss();
    const cuda::ErrorRecord r = recorded();
    if (r.code == cuda::kOk) return;
    if (!cuda::is_fatal(r.code)) {
      std::atomic_ref<int32_t>(static_cast<cuda::ErrorWord*>(error_host_)->code)
          .store(cuda::kOk, std::memory_order_relaxed);
      reset_pending_ = true;
    }
    raise(r);
  }

  // With Phase::both (recv_follows), the send kernel's last block also does the receive's waits
  // and the receive launches only its grid kernel: one kernel less per op. A split send must
  // not wait, so that the caller's work between the phases overlaps the transfer.
  void dispatch_send(const DispatchArgs& a) override {
    enter();
    dispatch_routed_ = routing_needed();
    AllToAllParams p = with_dispatch(a);
    p.fuse_recv = a.recv_follows;
    stage_indices(a.indices, dispatch_routed_, dispatch_indices_, nullptr, nullptr);
    cuda::launch_dispatch_send(p, stream_, blocks_);
    recv_waited_ = a.recv_follows;
  }
  void dispatch_recv(const DispatchArgs& a) override {
    enter();
    const bool waited = std::exchange(recv_waited_, false);
    // land_rows takes a slot a block: no more blocks than slots can arrive.
    cuda::launch_dispatch_recv(with_dispatch(a), stream_, grid_for(most_slots(a.m)), waited);
  }
  void combine_send(const CombineArgs& a) override {
    enter();
    params_.y_dtype = int(a.expert_y.dtype());  // named by a later dtype-mismatch report
    combine_routed_ = routing_needed();
    AllToAllParams p = with_combine(a);
    p.fuse_recv = a.recv_follows;
    stage_indices(a.indices, combine_routed_, combine_indices_, a.weights.data<float>(),
                  combine_weights_);
    // return_rows copies a route a block, or, in place with every source direct, writes a row
    // ref a thread: no more blocks than that work.
    const int64_t routes = most_slots(a.m) * layout_.max_pairs;
    const bool refs_only = p.y_in_place && every_peer_direct();
    cuda::launch_combine_send(
        p, stream_, grid_for(refs_only ? (routes + cuda::kBlockThreads - 1) / cuda::kBlockThreads
                                       : routes));
    recv_waited_ = a.recv_follows;
  }
  // The table and the live ranks go to device memory, where every call's kernels read them, in
  // stream order: after every kernel already enqueued, before any enqueued later. No wait for the
  // device: at construction a peer may already spin in its first dispatch.
  void set_routing(const SlotTable& table, const std::vector<uint8_t>& live) override {
    live_ranks_ = live;
    if (loss_) loss_->restart(live, /*clear=*/false);
    if (!routes_slots_) return;  // no placement, no mask: indices are slots
    rewrites_ = table.rewrites();
    table_view_ = {table_first_, table_slots_, table.logical_experts(),
                   config_.masked_experts == MaskedExperts::renormalize};
    // One staging copy, alive and unchanged until the stream has read it: the next change
    // waits for this rank's stream first.
    if (!routing_upload_.empty()) PMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    routing_upload_.assign(table.first().begin(), table.first().end());
    routing_upload_.insert(routing_upload_.end(), table.slots().begin(), table.slots().end());
    routing_upload_.insert(routing_upload_.end(), live.begin(), live.end());
    const size_t first = table.first().size(), slots = table.slots().size();
    PMOE_CUDA_CHECK(cudaMemcpyAsync(table_first_, routing_upload_.data(), sizeof(int32_t) * first,
                                    cudaMemcpyHostToDevice, stream_));
    PMOE_CUDA_CHECK(cudaMemcpyAsync(table_slots_, routing_upload_.data() + first,
                                    sizeof(int32_t) * slots, cudaMemcpyHostToDevice, stream_));
    PMOE_CUDA_CHECK(cudaMemcpyAsync(live_, routing_upload_.data() + first + slots,
                                    sizeof(int32_t) * live.size(), cudaMemcpyHostToDevice,
                                    stream_));
  }
  void combine_recv(const CombineArgs& a) override {
    enter();
    const bool waited = std::exchange(recv_waited_, false);
    cuda::launch_combine_recv(with_combine(a), stream_, blocks_, waited);
  }

  void set_loss_board(LossBoard& board, double) override { loss_->attach(board, live_ranks_); }
  int64_t calls_made(int64_t) override {
    PMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return int64_t(device_round().first);
  }
  // The abandoned calls' kernels have ended (check_loss, or a rejoin between calls): what they
  // left in scratch is cleared and the epoch set, in stream order before the next call's
  // kernels, which a graph captured earlier also reads from here.
  void restart_at(int64_t calls_base) override {
    if (!loss_) return;
    PMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    auto* base = static_cast<std::byte*>(scratch_);
    PMOE_CUDA_CHECK(cudaMemsetAsync(base, 0, error_at_, stream_));
    PMOE_CUDA_CHECK(cudaMemsetAsync(base + error_at_, 0, offsetof(cuda::ErrorWord, host_mirror),
                                    stream_));
    const size_t after_error = error_at_ + (sizeof(cuda::ErrorWord) + 255) / 256 * 256;
    PMOE_CUDA_CHECK(cudaMemsetAsync(base + after_error, 0, calls_state_end_ - after_error,
                                    stream_));  // the round too: dispatch(send) comes next
    restart_epoch_ = uint64_t(calls_base);
    PMOE_CUDA_CHECK(cudaMemcpyAsync(params_.epoch, &restart_epoch_, sizeof restart_epoch_,
                                    cudaMemcpyHostToDevice, stream_));
    PMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memset(error_host_, 0, offsetof(cuda::ErrorWord, host_mirror));
    reset_pending_ = recv_waited_ = false;
    loss_->restart(live_ranks_, /*clear=*/true);
  }

 private:
  // on_peer_loss = mask, at each call and in check_errors(): a wait that timed out or ended on
  // the abort word, or news the watcher left there, ends this rank's calls in flight: every wait
  // is made to end, the stream drained, and PeerLossNoticed thrown for the op's agreement, with
  // the calls this rank's kernels finished (those before the failed wait's epoch).
  void check_loss() const {
    if (!loss_) return;
    const cuda::ErrorRecord r = recorded();
    const bool lost_wait = r.code == cuda::kTimeout || r.code == cuda::kAborted;
    if (!lost_wait && !loss_->abort_set()) return;
    PeerLossNoticed noticed;
    end_calls(noticed);
    throw noticed;
  }

  void end_calls(PeerLossNoticed& noticed) const override {
    loss_->set_abort();
    PMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const cuda::ErrorRecord r = recorded();
    const bool lost_wait = r.code == cuda::kTimeout || r.code == cuda::kAborted;
    if (r.code == cuda::kTimeout) {
      noticed.suspects.push_back(r.detail);
      noticed.reasons.push_back(cat("awaited for more than ", params_.timeout_ns / 1e9, " s"));
    }
    if (cuda::is_fatal(r.code) && !lost_wait) raise(r);
    const auto [epoch, round] = device_round();
    noticed.calls_started = int64_t(epoch);
    if (lost_wait)
      noticed.calls_done = int64_t(r.call) - 1;
    else  // every kernel ran to its end: the last call did unless only its dispatch ran
      noticed.calls_done =
          int64_t(epoch) - (round.next_step == int32_t(Step::dispatch_send) ? 0 : 1);
  }

  // After a stream synchronisation: the calls the device began (dispatch(send) counts them in
  // the epoch) and the step it expects next.
  std::pair<uint64_t, cuda::Round> device_round() const {
    std::pair<uint64_t, cuda::Round> out;
    PMOE_CUDA_CHECK(cudaMemcpy(&out.first, params_.epoch, sizeof out.first,
                               cudaMemcpyDeviceToHost));
    PMOE_CUDA_CHECK(cudaMemcpy(&out.second, params_.round, sizeof out.second,
                               cudaMemcpyDeviceToHost));
    return out;
  }

  // The host-mapped mirror, which a kernel may be writing: atomically, the code first (a kernel
  // stores it last, with release), through cuda::atomic_ref, whose loads the emulated device
  // judges (src/cuda/emulator/host_view.hpp).
  cuda::ErrorRecord recorded() const {
    auto& e = *static_cast<cuda::ErrorWord*>(error_host_);
    auto load = [](int32_t& field, ::cuda::memory_order order) {
      return ::cuda::atomic_ref<int32_t, ::cuda::thread_scope_system>(field).load(order);
    };
    const int32_t code = load(e.code, ::cuda::memory_order_acquire);
    return {code, load(e.detail, ::cuda::memory_order_relaxed),
            load(e.step, ::cuda::memory_order_relaxed),
            load(e.value, ::cuda::memory_order_relaxed),
            ::cuda::atomic_ref<uint64_t, ::cuda::thread_scope_system>(e.call).load(
                ::cuda::memory_order_relaxed)};
  }

  [[noreturn]] void raise(const cuda::ErrorRecord& r) const {
    cuda::raise_recorded(r, params_, device_.str(), ranks_per_node());
  }

  // At every launch: a peer thread rank that already threw (its kernels will never signal), a
  // node peer whose process ended (with on_peer_loss = mask the watcher takes that as news
  // instead) and a fatal error the kernels recorded raise here, before more kernels wait for
  // nothing. A non-fatal one is left to check_errors(): raising it here would stop this rank's
  // next phase while its peers wait for it. A record check_errors() cleared is cleared on the
  // device too, in stream order, before this launch.
  void enter() const {
    if (loss_)
      group_of(comm_)->check_failed(comm_.rank());
    else
      comm_.check_group();
    check_loss();
    const cuda::ErrorRecord r = recorded();
    if (cuda::is_fatal(r.code)) raise(r);
    if (reset_pending_) {
      PMOE_CUDA_CHECK(cudaMemsetAsync(params_.error, 0, offsetof(cuda::ErrorWord, host_mirror),
                                      stream_));
      reset_pending_ = false;
    }
  }

  // The indices the kernels read: the caller's, or their staged copy (stage_indices() at the
  // send; the recv reads the same copy).
  const int32_t* indices_for_kernels(const Tensor& indices, bool routed,
                                     const int32_t* staged) const {
    return routed || indices.dtype() == DType::i64 ? staged : indices.data<int32_t>();
  }
  // Whether this call routes its indices to slots in a kernel: when the table rewrites them (a
  // placement, or a masked rank), and, with rank_mask, whenever the call is being captured, so
  // that a replay after a later mask routes around it. An eager call with every rank live reads
  // the caller's indices as they are: the mask costs it nothing.
  bool routing_needed() const {
    if (!routes_slots_) return false;
    if (rewrites_) return true;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    PMOE_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    return capture != cudaStreamCaptureStatusNone;
  }
  // Slots from the caller's indices into `staged`: routed (a placement or a mask: then combine's
  // weights too, into weights_out), or i64 narrowed; i32 slots as they are stay where they are.
  void stage_indices(const Tensor& indices, bool routed, int32_t* staged, const float* weights,
                     float* weights_out) const {
    const bool wide = indices.dtype() == DType::i64;
    if (routed)
      cuda::launch_route_slots(indices.data(), wide, indices.size(0), config_.top_k,
                               comm_.rank(), table_view_, staged, weights, weights_out, stream_,
                               blocks_);
    else if (wide)
      cuda::launch_narrow_indices(indices.data<int64_t>(), staged, indices.numel(), stream_,
                                  blocks_);
  }

  AllToAllParams with_dispatch(const DispatchArgs& a) const {
    AllToAllParams p = params_;
    p.x = static_cast<const std::byte*>(a.x.data());
    p.x_scale = a.x_scale.data<float>();
    p.indices = indices_for_kernels(a.indices, dispatch_routed_, dispatch_indices_);
    p.expert_num_tokens = a.expert_num_tokens.data<int32_t>();
    p.expert_x = static_cast<std::byte*>(a.expert_x.data());
    p.expert_x_scale = a.expert_x_scale.data<float>();
    p.m = a.m;
    p.bound_m = a.bound_m.data<int32_t>();
    p.x_in_place = config_.in_place_buffers && p.x == region() + layout_.input_offset &&
                   (!layout_.scale_bytes ||
                    reinterpret_cast<const std::byte*>(p.x_scale) ==
                        region() + layout_.input_scale_offset);
    return p;
  }
  AllToAllParams with_combine(const CombineArgs& a) const {
    AllToAllParams p = params_;
    p.expert_y = static_cast<const std::byte*>(a.expert_y.data());
    p.y_elem_bytes = dtype_size(a.expert_y.dtype());
    p.y_dtype = int(a.expert_y.dtype());
    p.indices = indices_for_kernels(a.indices, combine_routed_, combine_indices_);
    p.weights = combine_routed_ ? combine_weights_ : a.weights.data<float>();
    p.y = static_cast<std::byte*>(a.y.data());
    p.m = a.m;
    p.bound_m = a.bound_m.data<int32_t>();
    p.y_in_place = p.row_refs && a.expert_y.dtype() == config_.out_dtype &&
                   p.expert_y == region() + layout_.expert_output_offset;
    return p;
  }
  // The most token slots this rank can receive in a call: every rank's bound, or this rank's m
  // when it is the only one.
  int64_t most_slots(int64_t m) const {
    return comm_.size() == 1 ? m : int64_t(comm_.size()) * config_.max_tokens;
  }
  int grid_for(int64_t work) const { return int(std::clamp<int64_t>(work, 1, blocks_)); }
  bool every_peer_direct() const {
    for (int r = 0; r < comm_.size(); ++r)
      if (!params_.regions[r]) return false;
    return true;
  }
  // This rank's symmetric region (device memory).
  std::byte* region() const { return params_.regions[params_.rank]; }

  // True when every rank is a thread of this process on this rank's device and none is behind
  // the remote path: then the peers' loads and stores and this rank's are all on one GPU, and
  // device scope orders them. Ranks in other processes may sit on other GPUs (CUDA IPC).
  bool every_peer_on_this_device(Communicator& comm) const {
    if (ranks_per_node() != comm.size()) return false;
    struct Place {
      int64_t process, device;  // no padding: every byte is sent
    } mine{int64_t(getpid()), int64_t(device_.index)};
    const auto all = comm.all_gather(std::as_bytes(std::span(&mine, 1)));
    const auto* places = reinterpret_cast<const Place*>(all.data());
    for (size_t r = 0; r < all.size() / sizeof(Place); ++r)
      if (places[r].process != mine.process || places[r].device != mine.device) return false;
    return true;
  }

  int ranks_per_node() const {
    const int W = comm_.size(), n = config_.ranks_per_node;
    return n > 0 && n < W ? n : W;
  }
  Communicator& comm_;
  AllToAllConfig config_;
  AllToAllLayout layout_;
  Device device_;
  cudaStream_t stream_;
  std::unique_ptr<SymmetricMemory> memory_;
  std::unique_ptr<cuda::RemoteSetup> remote_;  // the remote path (split worlds), before the kernels
  AllToAllParams params_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  int32_t* dispatch_indices_ = nullptr;  // in scratch_: i64 indices narrowed (narrow_if_wide)
  int32_t* combine_indices_ = nullptr;
  // Routing (set_routing), in scratch_: with a placement or a mask, a call's indices are routed
  // to slots by a kernel reading the table there (routing_needed() says which calls).
  bool routes_slots_ = false;
  bool rewrites_ = false;  // the table maps some index elsewhere than itself
  bool dispatch_routed_ = false, combine_routed_ = false;  // this call's sends routed (the recvs
                                                           // read what their sends staged)
  int32_t* table_first_ = nullptr;
  int32_t* table_slots_ = nullptr;
  int32_t* live_ = nullptr;
  float* combine_weights_ = nullptr;
  ::pmoe::detail::SlotTableView table_view_{};
  std::vector<int32_t> routing_upload_;  // the table and live ranks as last sent (set_routing)
  void* error_host_ = nullptr;
  size_t error_at_ = 0, calls_state_end_ = 0;  // in scratch_: the error word; past a call's state
  std::unique_ptr<DevicePeerLoss> loss_;  // on_peer_loss = mask
  std::vector<uint8_t> live_ranks_;       // as set_routing() last gave them
  uint64_t restart_epoch_ = 0;            // restart_at()'s copy source
  mutable bool reset_pending_ = false;  // check_errors() raised a non-fatal error
  bool recv_waited_ = false;  // the last send kernel also did the receive's waits
  int blocks_ = 1;
};

}  // namespace

std::unique_ptr<AllToAllBackend> make_device_all_to_all(Communicator& comm,
                                                         const AllToAllConfig& config) {
  return std::make_unique<CudaAllToAll>(comm, config);
}

}  // namespace pmoe::detail::inline PMOE_CUDA_FLAVOR
