// AllToAll's front end: the ranks' agreement on the config (its checks: config.cpp), argument
// validation, the phase order, and the hand-off to the backend. Everything here runs before a
// byte leaves the rank.
#include "pmoe/all_to_all.hpp"

#include <algorithm>
#include <vector>

#include "all_to_all/loss_board.hpp"
#include "all_to_all/route.hpp"
#include "all_to_all/slot_table.hpp"
#include "all_to_all/step.hpp"
#include "all_to_all/wire_dtypes.hpp"
#include "backends/all_to_all_backend.hpp"
#include "backends/registry.hpp"
#include "core/arg_checks.hpp"
#include "core/config_agreement.hpp"
#include "pmoe/error.hpp"

namespace pmoe {
namespace {

using detail::check_absent;
using detail::check_index_tensor;
using detail::check_tensor;
using detail::first_in_group;
using detail::is_output_dtype;

// The first m rows of `indices` [rows, k] hold experts in [-1, E) and no expert twice.
template <typename Index>
void check_indices(const char* op, const Index* idx, int64_t m, int64_t k, int num_experts) {
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const Index e = idx[t * k + j];
      PMOE_CHECK(e >= -1 && e < num_experts, op, ": indices[", t, ", ", j, "] = ", e,
                 " is outside [-1, ", num_experts, ")");
      const Index* row = idx + t * k;
      if (e < 0 || first_in_group(row, int(j), num_experts, 1)) continue;  // the kernels' rule
      const int64_t i = std::find(row, row + j, e) - row;  // the earlier slot, for the message
      throw Error(detail::cat(op, ": expert ", e, " appears twice in row ", t, " of indices (slots ",
                              i, " and ", j, "); use -1 for an unused slot"));
    }
  }
}

// FNV-1a over a placement's slots, so that ranks with different placements disagree at
// construction instead of routing the same token differently.
int64_t placement_hash_of(const ExpertPlacement& p) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t e : p.slot_expert) h = (h ^ uint64_t(uint32_t(e))) * 0x100000001b3ull;
  return int64_t(h >> 1);
}

// "AllToAll::dispatch(send)", "AllToAll::combine", ...: how errors name the call.
const char* op_name(bool dispatch, Phase phase) {
  static const char* names[2][3] = {
      {"AllToAll::combine(send)", "AllToAll::combine(recv)", "AllToAll::combine"},
      {"AllToAll::dispatch(send)", "AllToAll::dispatch(recv)", "AllToAll::dispatch"}};
  return names[dispatch][int(phase)];
}

}  // namespace

AllToAll::AllToAll(Communicator& comm, const AllToAllConfig& config)
    : AllToAll(comm, config, comm.device()) {}

// Every rank's config against every other's, and this rank's against its world (collective): at
// construction, and again when a newcomer in a lost rank's place builds the op (admit). Ranks
// agree on the dimensions under their current names, whichever names each rank used.
void AllToAll::agree_on_config(Communicator& comm, const AllToAllConfig& config,
                               Device device) const {
  const MoeShape shape = config.with_current_names().shape();
  detail::ConfigAgreement agree("AllToAll");
  agree.field("max_tokens", shape.max_tokens);
  agree.field("num_experts", shape.num_experts);
  agree.field("top_k", shape.top_k);
  agree.field("hidden_dim", shape.hidden_dim);
  agree.field("in_dtype", int64_t(config.in_dtype), detail::show_dtype);
  agree.field("scale_block", config.scale_block);
  agree.field("out_dtype", int64_t(config.out_dtype), detail::show_dtype);
  agree.field("in_place_buffers", config.in_place_buffers, detail::show_bool);
  agree.field("ranks_per_node", config.ranks_per_node);
  agree.field("cross_node", int64_t(config.cross_node), detail::show_cross_node);
  agree.field("combine_sums_in_node", config.combine_sums_in_node, detail::show_bool);
  agree.field("placement (its logical experts)", config.placement.num_logical_experts);
  agree.field("placement (a hash of its slots)", placement_hash_of(config.placement));
  agree.field("rank_mask", config.rank_mask, detail::show_bool);
  agree.field("on_peer_loss (0 fail, 1 mask)", int64_t(config.on_peer_loss));
  agree.field("masked_experts", int64_t(config.masked_experts));
  agree.check(comm, [&] {
    config.validate(world_size_);  // as given: an alias that disagrees is refused
    PMOE_CHECK(device == comm.device(), "AllToAll: device ", device.str(),
               " differs from the communicator's ", comm.device().str());
  });
}

AllToAll::AllToAll(Communicator& comm, const AllToAllConfig& config, Device device)
    : config_(config.with_current_names()),
      comm_(&comm),
      rank_(comm.rank()),
      world_size_(comm.size()),
      device_(device) {
  agree_on_config(comm, config, device);
  num_local_experts_ = config_.num_experts / world_size_;
  mask_.live.assign(size_t(world_size_), 1);
  mask_.reasons.assign(size_t(world_size_), "");
  slot_table_ = std::make_unique<detail::SlotTable>(config_, world_size_);
  backend_ = detail::backends(device).make_all_to_all(comm, config_);
  backend_->set_routing(*slot_table_, mask_.live);
  if (config_.on_peer_loss == OnPeerLoss::mask) {
    const double timeout =
        config_.peer_timeout_s > 0 ? config_.peer_timeout_s : comm.timeout_s();
    loss_board_ = std::make_unique<detail::LossBoard>(comm, timeout);
    // A backstop: the board ends a wait on a lost peer first.
    backend_->set_loss_board(*loss_board_, timeout + comm.timeout_s());
  }
}

void AllToAll::mask_rank(int rank, const std::string& reason) {
  const char* op = "AllToAll::mask_rank";
  PMOE_CHECK(config_.maskable(), op, ": set AllToAllConfig::rank_mask (or on_peer_loss = mask) "
             "to make the op maskable");
  PMOE_CHECK(broken_.empty(), op, " on rank ", rank_, ": this AllToAll is unusable since an ",
             "earlier call failed while waiting for peers (", broken_, "); create a new one");
  PMOE_CHECK(next_ == Step::dispatch_send, op, " on rank ", rank_, ": mask between calls "
             "(after combine(recv)); the next step is ", detail::step_name(next_));
  PMOE_CHECK(rank >= 0 && rank < world_size_, op, ": rank ", rank, " is outside [0, ",
             world_size_, ")");
  PMOE_CHECK(rank != rank_, op, " on rank ", rank_, ": a rank cannot mask itself (the others "
             "mask it; it then stops calling the op), and the last live rank cannot be masked");
  if (!mask_.live[size_t(rank)]) return;  // masked already: the first reason stays
  mask_.live[size_t(rank)] = 0;
  mask_.reasons[size_t(rank)] = reason.empty() ? "masked by the caller" : reason;
  slot_table_->set_live(mask_.live);
  backend_->set_routing(*slot_table_, mask_.live);
}

void AllToAll::unmask_rank(int rank) {
  const char* op = "AllToAll::unmask_rank";
  PMOE_CHECK(loss_board_, op, ": set AllToAllConfig::on_peer_loss = mask (the returning rank "
             "learns the group's mask and call count from its board)");
  PMOE_CHECK(broken_.empty(), op, " on rank ", rank_, ": this AllToAll is unusable (", broken_,
             "); call rejoin() on it first");
  PMOE_CHECK(next_ == Step::dispatch_send, op, " on rank ", rank_, ": unmask between calls "
             "(after combine(recv)); the next step is ", detail::step_name(next_));
  PMOE_CHECK(rank >= 0 && rank < world_size_, op, ": rank ", rank, " is outside [0, ",
             world_size_, ")");
  PMOE_CHECK(!mask_.live[size_t(rank)], op, " on rank ", rank_, ": rank ", rank, " is live");
  loss_board_->await_joining(rank, loss_board_->peer_timeout_s() + comm_->timeout_s());
  mask_.live[size_t(rank)] = 1;
  mask_.reasons[size_t(rank)].clear();
  slot_table_->set_live(mask_.live);
  backend_->set_routing(*slot_table_, mask_.live);
  calls_started_ = calls_done_ = backend_->calls_made(calls_started_);
  loss_board_->post_mask(mask_.live, calls_started_);
}

AllToAll::AllToAll(Communicator& comm, const AllToAllConfig& config, Replacing)
    : AllToAll(comm, config, comm.device()) {
  // The constructor above ran the survivors' admit with them: the config agreed, and each
  // allocation took over the lost rank's memory, which they handed over. What is left is what a
  // rank that comes back does.
  PMOE_CHECK(loss_board_, "AllToAll (replacing a lost rank): set AllToAllConfig::on_peer_loss = "
             "mask");
  loss_board_->take_over_post();
  rejoin();
}

void AllToAll::admit(int rank) {
  const char* op = "AllToAll::admit";
  PMOE_CHECK(loss_board_, op, ": set AllToAllConfig::on_peer_loss = mask (a newcomer joins as a "
             "rank that comes back does)");
  PMOE_CHECK(device_.kind == Device::Kind::cpu, op, " on rank ", rank_, ": a newcomer on ",
             device_.str(), " is not built yet; the CPU only");
  PMOE_CHECK(broken_.empty(), op, " on rank ", rank_, ": this AllToAll is unusable (", broken_,
             ")");
  PMOE_CHECK(next_ == Step::dispatch_send, op, " on rank ", rank_, ": admit between calls "
             "(after combine(recv)); the next step is ", detail::step_name(next_));
  PMOE_CHECK(rank >= 0 && rank < world_size_, op, ": rank ", rank, " is outside [0, ",
             world_size_, ")");
  PMOE_CHECK(!mask_.live[size_t(rank)], op, " on rank ", rank_, ": rank ", rank, " is live (a "
             "newcomer takes the place of a rank the survivors masked)");
  agree_on_config(*comm_, config_, device_);
  for (SymmetricMemory* memory : backend_->symmetric_memory()) comm_->hand_over(*memory, rank);
  comm_->hand_over(loss_board_->memory(), rank);
  unmask_rank(rank);
}

void AllToAll::rejoin() {
  const char* op = "AllToAll::rejoin";
  PMOE_CHECK(loss_board_, op, ": set AllToAllConfig::on_peer_loss = mask");
  PMOE_CHECK(next_ == Step::dispatch_send || !broken_.empty(), op, " on rank ", rank_,
             ": rejoin between calls (after combine(recv)); the next step is ",
             detail::step_name(next_));
  const detail::LossBoard::Joined joined =
      loss_board_->join(loss_board_->peer_timeout_s() + comm_->timeout_s());
  for (int r = 0; r < world_size_; ++r) {
    mask_.live[size_t(r)] = !joined.lost[size_t(r)];
    if (!mask_.live[size_t(r)] && mask_.reasons[size_t(r)].empty())
      mask_.reasons[size_t(r)] = "masked by the group while this rank was away";
    if (mask_.live[size_t(r)]) mask_.reasons[size_t(r)].clear();
  }
  slot_table_->set_live(mask_.live);
  backend_->set_routing(*slot_table_, mask_.live);
  backend_->restart_at(joined.calls);
  calls_started_ = calls_done_ = restarted_at_ = joined.calls;
  next_ = Step::dispatch_send;
  arriving_ = -1;
  broken_.clear();
}

std::vector<int> AllToAll::lost_experts() const { return slot_table_->lost_experts(); }

AllToAll::~AllToAll() = default;

size_t AllToAll::workspace_bytes() const { return backend_->workspace_bytes(); }

AllToAll::RemoteTraffic AllToAll::remote_traffic() const { return backend_->remote_traffic(); }

namespace {
Tensor require_in_place(const Tensor& t, const char* name, bool f8_only, const AllToAllConfig& c) {
  PMOE_CHECK(c.in_place_buffers, "AllToAll::", name, ": set AllToAllConfig::in_place_buffers ",
             "to allocate the in-place buffers");
  PMOE_CHECK(!f8_only || c.in_dtype == DType::f8e4m3, "AllToAll::", name,
             ": scales exist for f8e4m3 input only");
  return t;
}
}  // namespace

Tensor AllToAll::input_buffer() const {
  return require_in_place(backend_->input_buffer(), "input_buffer", false, config_);
}
Tensor AllToAll::input_scale_buffer() const {
  return require_in_place(backend_->input_scale_buffer(), "input_scale_buffer", true, config_);
}
Tensor AllToAll::expert_output_buffer() const {
  return require_in_place(backend_->expert_output_buffer(), "expert_output_buffer", false,
                          config_);
}

void AllToAll::enter(Step step, const char* op) {
  PMOE_CHECK(broken_.empty(), op, " on rank ", rank_, ": this AllToAll is unusable since an ",
             "earlier call failed while waiting for peers (", broken_, "); create a new one");
  PMOE_CHECK(step == next_, op, " on rank ", rank_, ": phase out of order: expected ",
             detail::step_name(next_), ", got ", detail::step_name(step));
}

void AllToAll::guarded(const std::function<void()>& call) {
  started_ = false;
  try {
    call();
  } catch (const Error& e) {
    if (!started_) comm_->note_rejection(e.what());
    throw;
  }
}

void AllToAll::run_step(Step step, const char* op, const std::function<void()>& body) {
  if (!started_) comm_->note_rejection("");  // the checks passed: nothing to tell the peers
  started_ = true;
  if (loss_board_ && (step == Step::dispatch_send || step == Step::combine_send)) {
    const std::string why = loss_board_->held_lost_by(mask_.live);
    if (!why.empty()) retire_excluded(why);
  }
  if (step == Step::dispatch_send) ++calls_started_;
  exchange(body);
  next_ = detail::next_step(step);
  if (step == Step::combine_recv) calls_done_ = calls_started_;
}

void AllToAll::exchange(const std::function<void()>& body) {
  try {
    body();
  } catch (const detail::PeerLossNoticed& noticed) {
    agree_and_restart(noticed);
  } catch (const std::exception& e) {
    broken_ = e.what();  // a failed wait leaves peers mid-protocol: no safe way to continue
    throw;
  }
}

void AllToAll::go_on_without(const std::vector<int>& ranks) {
  const char* op = "AllToAll::go_on_without";
  PMOE_CHECK(loss_board_, op, ": set AllToAllConfig::on_peer_loss = mask");
  PMOE_CHECK(broken_.empty(), op, " on rank ", rank_, ": this AllToAll is unusable (", broken_,
             ")");
  detail::PeerLossNoticed noticed;
  for (int r : ranks) {
    PMOE_CHECK(r >= 0 && r < world_size_ && r != rank_, op, " on rank ", rank_, ": rank ", r,
               " is not another rank of [0, ", world_size_, ")");
    if (!mask_.live[size_t(r)]) continue;
    noticed.suspects.push_back(r);
    noticed.reasons.push_back("lost by another op of this rank");
  }
  if (noticed.suspects.empty()) return;
  backend_->end_calls(noticed);
  agree_and_restart(noticed);
}

void AllToAll::retire_excluded(const std::string& why) {
  broken_ = detail::cat("the other ranks went on without this one: ", why);
  throw Error(detail::cat("AllToAll on rank ", rank_, ": ", broken_, "; this rank cannot use the "
                          "op again"));
}

void AllToAll::agree_and_restart(const detail::PeerLossNoticed& noticed) {
  // A device's counts, where it gave them: its kernels finish after the host's calls return, and
  // graph replays pass no host count. A call the host began counts even if its kernels never
  // ran: the caller made it, and it throws.
  const int64_t done = noticed.calls_done >= 0 ? noticed.calls_done : calls_done_;
  const int64_t begun = std::max(noticed.calls_started, calls_started_);
  const detail::LossBoard::Outcome out = loss_board_->agree(mask_.live, noticed, done, begun);
  if (out.excluded) retire_excluded(out.excluded_why);
  std::string names;
  for (size_t i = 0; i < out.lost.size(); ++i) {
    const int r = out.lost[i];
    mask_.live[size_t(r)] = 0;
    mask_.reasons[size_t(r)] = detail::cat("lost: ", out.reasons[i]);
    names += detail::cat(i ? ", " : "", r, " (", out.reasons[i], ")");
  }
  slot_table_->set_live(mask_.live);
  backend_->set_routing(*slot_table_, mask_.live);
  backend_->restart_at(out.calls_base);
  // Calls this rank returned before the last agreement were judged then.
  const int64_t first = std::max(out.first_lost_call, restarted_at_ + 1);
  const int64_t last = begun;
  calls_started_ = calls_done_ = restarted_at_ = out.calls_base;
  next_ = Step::dispatch_send;
  arriving_ = -1;
  // A device's check_errors() can find the loss after this rank's calls all finished: then
  // none of them is lost (the survivors lost calls this rank never began).
  const std::string calls =
      first > last    ? std::string("No call of this rank is lost")
      : first == last ? detail::cat("Call ", first, " of this rank is lost (run its tokens again)")
                      : detail::cat("Calls ", first, "..", last, " of this rank are lost (run "
                                    "their tokens again)");
  throw PeerLost(detail::cat("AllToAll on rank ", rank_, ": lost rank(s) ", names, "; the "
                             "survivors masked them and go on. ", calls, "; the next call is ",
                             calls_started_ + 1, " on every survivor"),
                 out.lost, std::min(first, last + 1), last);
}

int64_t AllToAll::tokens_this_call(const char* op, int64_t rows, const Tensor& bound_m) const {
  if (bound_m.empty()) return rows;
  check_tensor(op, "bound_m", bound_m, DType::i32, device_, {1});
  if (device_.kind != Device::Kind::cpu) return rows;  // the kernels read it, and check it
  const int32_t m = *bound_m.data<int32_t>();
  PMOE_CHECK(m >= 0 && m <= rows, op, ": bound_m = ", m, " is outside [0, ", rows,
             "] (the rows given)");
  return m;
}

Tensor AllToAll::indices_i32(const char* op, const Tensor& indices,
                             std::vector<int32_t>& storage) const {
  // i32 as it is; on a device the backend narrows i64 itself, on the rank's stream.
  if (indices.dtype() == DType::i32 || device_.kind != Device::Kind::cpu) return indices;
  // i64 (torch.topk's type) on the CPU: narrowed once per call. Every value the op reads was
  // checked to lie in [-1, E) (dispatch) or to equal dispatch's (combine), so nothing is lost.
  const int64_t* wide = indices.data<int64_t>();
  storage.assign(size_t(indices.numel()), 0);
  for (size_t i = 0; i < storage.size(); ++i) storage[i] = int32_t(wide[i]);
  return Tensor(storage.data(), DType::i32, {indices.size(0), indices.size(1)});
}

void AllToAll::dispatch(const Tensor& x, const Tensor& x_scale, const Tensor& indices,
                        const Tensor& expert_num_tokens, const Tensor& expert_x,
                        const Tensor& expert_x_scale, Phase phase, const Tensor& bound_m) {
  guarded([&] {
    dispatch_impl(x, x_scale, indices, expert_num_tokens, expert_x, expert_x_scale, phase,
                  bound_m);
  });
}

void AllToAll::dispatch_impl(const Tensor& x, const Tensor& x_scale, const Tensor& indices,
                             const Tensor& expert_num_tokens, const Tensor& expert_x,
                             const Tensor& expert_x_scale, Phase phase, const Tensor& bound_m) {
  const char* op = op_name(true, phase);
  enter(phase == Phase::recv ? Step::dispatch_recv : Step::dispatch_send, op);
  const int64_t H = config_.hidden_dim, k = config_.top_k;
  const int64_t rows = int64_t(world_size_) * config_.max_tokens;
  PMOE_CHECK(x.dim() == 2, op, ": `x` must be 2-D [m, ", H, "], got ", x.shape_str());
  const int64_t x_rows = x.size(0);
  PMOE_CHECK(x_rows <= config_.max_tokens, op, ": m = ", x_rows,
             " tokens exceeds max_tokens = ", config_.max_tokens);
  check_tensor(op, "x", x, config_.in_dtype, device_, {x_rows, H});
  check_index_tensor(op, "indices", indices, device_, {x_rows, k});
  check_tensor(op, "expert_num_tokens", expert_num_tokens, DType::i32, device_,
               {num_local_experts_});
  // Packed [R, H] rows: dispatch(send) writes none; a recv needs room for what arrives.
  const bool asked = arriving_ >= 0 && phase == Phase::recv;
  const int64_t most = rows * std::min<int64_t>(k, num_local_experts_);
  const int64_t min_rows = phase == Phase::send ? 0 : asked ? arriving_ : most;
  const char* reason = phase == Phase::send ? ""
                       : asked ? "the rows arriving this call (arriving_rows())"
                               : "the most that can arrive (W * max_tokens * "
                                 "min(k, E_local); ask arriving_rows() after dispatch(send) "
                                 "for this call's)";
  check_expert_rows(op, "expert_x", expert_x, config_.in_dtype, H, min_rows, reason);
  if (config_.in_dtype == DType::f8e4m3) {
    const int64_t s = config_.scales_per_token();
    check_tensor(op, "x_scale", x_scale, DType::f32, device_, {x_rows, s});
    check_expert_rows(op, "expert_x_scale", expert_x_scale, DType::f32, s, min_rows, reason);
  } else {
    check_absent(op, "x_scale", x_scale, "(scales are for f8e4m3 input only)");
    check_absent(op, "expert_x_scale", expert_x_scale, "(scales are for f8e4m3 input only)");
  }
  const int64_t m = tokens_this_call(op, x_rows, bound_m);
  // Index values are checked here where the host can read them; a device's kernels check them.
  const bool host_data = device_.kind == Device::Kind::cpu;
  if (host_data) {
    const int experts = slot_table_->logical_experts();
    if (indices.dtype() == DType::i64)
      check_indices(op, indices.data<int64_t>(), m, k, experts);
    else
      check_indices(op, indices.data<int32_t>(), m, k, experts);
  }
  const Tensor idx32 = indices_i32(op, indices, dispatch_indices_);
  const Tensor slots = host_data ? slots_on_host(idx32, m, Tensor(), nullptr) : idx32;

  const detail::DispatchArgs args{x, x_scale, slots, expert_num_tokens, expert_x,
                                  expert_x_scale, int(m), bound_m, phase == Phase::both};
  if (phase != Phase::recv) {
    if (host_data) {
      const int32_t* idx = idx32.data<int32_t>();
      routed_indices_.assign(idx, idx + m * k);
    }
    run_step(Step::dispatch_send, op, [&] { backend_->dispatch_send(args); });
  }
  if (phase != Phase::send) {
    run_step(Step::dispatch_recv, op, [&] { backend_->dispatch_recv(args); });
    arriving_ = -1;
    if (config_.packed_expert_rows) {  // the CPU backend's: the counts are host memory
      const int32_t* counts = expert_num_tokens.data<int32_t>();
      arrived_ = 0;
      for (int e = 0; e < num_local_experts_; ++e) arrived_ += counts[e];
    }
  }
}

int64_t AllToAll::arriving_rows() {
  const char* op = "AllToAll::arriving_rows";
  PMOE_CHECK(config_.packed_expert_rows, op, ": set AllToAllConfig::packed_expert_rows (the "
             "count sizes a packed expert_x; padded blocks always fit)");
  PMOE_CHECK(broken_.empty(), op, " on rank ", rank_, ": this AllToAll is unusable since an ",
             "earlier call failed while waiting for peers (", broken_, "); create a new one");
  PMOE_CHECK(next_ == Step::dispatch_recv, op, " on rank ", rank_, ": ask between "
             "dispatch(send) and dispatch(recv); the next step is ", detail::step_name(next_));
  exchange([&] { arriving_ = backend_->arriving_rows(); });
  return arriving_;
}

void AllToAll::check_expert_rows(const char* op, const char* name, const Tensor& t, DType dtype,
                                 int64_t width, int64_t min_rows, const char* reason) const {
  if (config_.packed_expert_rows && t.dim() == 2) {
    check_tensor(op, name, t, dtype, device_, {t.size(0), width});
    PMOE_CHECK(t.size(0) >= min_rows, op, ": packed `", name, "` has ", t.size(0), " rows, "
               "fewer than ", reason, ": ", min_rows);
    return;
  }
  const int64_t rows = int64_t(world_size_) * config_.max_tokens;
  check_tensor(op, name, t, dtype, device_, {num_local_experts_, rows, width});
}

void AllToAll::combine(const Tensor& expert_y, const Tensor& indices, const Tensor& weights,
                       const Tensor& y, Phase phase, const Tensor& bound_m) {
  guarded([&] { combine_impl(expert_y, indices, weights, y, phase, bound_m); });
}

void AllToAll::combine_impl(const Tensor& expert_y, const Tensor& indices, const Tensor& weights,
                            const Tensor& y, Phase phase, const Tensor& bound_m) {
  const char* op = op_name(false, phase);
  enter(phase == Phase::recv ? Step::combine_recv : Step::combine_send, op);
  const int64_t H = config_.hidden_dim, k = config_.top_k;
  PMOE_CHECK(y.dim() == 2, op, ": `y` must be 2-D [m, ", H, "], got ", y.shape_str());
  const int64_t y_rows = y.size(0);
  PMOE_CHECK(is_output_dtype(expert_y.dtype()), op, ": `expert_y` must be f32, bf16 or f16 (float32, ",
             "bfloat16 or float16), got ", detail::dtype_words(expert_y.dtype()));
  check_expert_rows(op, "expert_y", expert_y, expert_y.dtype(), H, arrived_,
                    "the rows the matching dispatch received");
  check_index_tensor(op, "indices", indices, device_, {y_rows, k});
  check_tensor(op, "weights", weights, DType::f32, device_, {y_rows, k});
  check_tensor(op, "y", y, config_.out_dtype, device_, {y_rows, H});
  const int64_t m = tokens_this_call(op, y_rows, bound_m);
  if (device_.kind == Device::Kind::cpu) {
    PMOE_CHECK(size_t(m * k) == routed_indices_.size(), op, ": `y` has ", m,
               " rows but the matching dispatch had ", routed_indices_.size() / size_t(k),
               " tokens");
    // Compared before narrowing, so that an i64 value is never mistaken for its low 32 bits.
    auto index = [&](int64_t i) {
      return indices.dtype() == DType::i64 ? indices.data<int64_t>()[i]
                                           : int64_t(indices.data<int32_t>()[i]);
    };
    for (int64_t i = 0; i < m * k; ++i)
      PMOE_CHECK(index(i) == routed_indices_[size_t(i)], op, ": indices[", i / k, ", ", i % k,
                 "] = ", index(i), " differs from the ", routed_indices_[size_t(i)],
                 " given to the matching dispatch");
  }
  if (phase == Phase::recv)
    PMOE_CHECK(expert_y.dtype() == sent_expert_y_dtype_, op, ": `expert_y` is ",
               dtype_name(expert_y.dtype()), " but combine(send) sent ",
               dtype_name(sent_expert_y_dtype_));
  sent_expert_y_dtype_ = expert_y.dtype();

  const Tensor idx32 = indices_i32(op, indices, combine_indices_);
  Tensor routed_weights = weights;
  const Tensor slots = device_.kind == Device::Kind::cpu
                           ? slots_on_host(idx32, m, weights, &routed_weights)
                           : idx32;
  const detail::CombineArgs args{expert_y, slots, routed_weights, y, int(m), bound_m,
                                 phase == Phase::both};
  if (phase != Phase::recv)
    run_step(Step::combine_send, op, [&] { backend_->combine_send(args); });
  if (phase != Phase::send)
    run_step(Step::combine_recv, op, [&] { backend_->combine_recv(args); });
}

Tensor AllToAll::slots_on_host(const Tensor& idx32, int64_t m, const Tensor& weights,
                               Tensor* weights_out) {
  if (!slot_table_->rewrites()) return idx32;
  const int k = config_.top_k;
  const detail::SlotTableView table = slot_table_->view();
  const int32_t* logical = idx32.data<int32_t>();
  routed_slots_.assign(size_t(idx32.numel()), -1);
  if (weights_out) routed_weights_.assign(size_t(weights.numel()), 0.0f);
  const float* w = weights_out ? weights.data<float>() : nullptr;
  for (int64_t t = 0; t < m; ++t)
    detail::route_row(table, logical + t * k, k, rank_, t, routed_slots_.data() + t * k,
                      w ? w + t * k : nullptr, w ? routed_weights_.data() + t * k : nullptr);
  if (weights_out)
    *weights_out = Tensor(routed_weights_.data(), DType::f32, {weights.size(0), int64_t(k)});
  return Tensor(routed_slots_.data(), DType::i32, {idx32.size(0), int64_t(k)});
}

void AllToAll::check_errors() {
  try {
    backend_->check_errors();
  } catch (const detail::PeerLossNoticed& noticed) {  // a device's kernels found a peer lost
    agree_and_restart(noticed);
  }
}

}  // namespace pmoe
