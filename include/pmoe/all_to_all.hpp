// AllToAll: the expert-parallel exchange of an MoE layer.
//
//   dispatch: every token goes to the ranks that own its top-k experts (once per rank, however
//             many of that rank's experts it chose), and lands in per-expert rows there;
//   combine:  the expert outputs come back and are summed with the router weights.
//
// W ranks, E experts, E_local = E / W; rank r owns experts [r * E_local, (r + 1) * E_local).
// Received rows of each expert are ordered by (source rank, source token index), so results are
// bit-identical run after run. Every call validates all of its arguments before a byte leaves
// the rank; a rejected call throws pmoe::Error and leaves the op usable.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pmoe/comm.hpp"
#include "pmoe/dtype.hpp"
#include "pmoe/placement.hpp"
#include "pmoe/shape.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe {

// How dispatch reaches ranks on other nodes (AllToAllConfig::cross_node).
//   direct:       one transfer per (token, destination rank), as pplx-kernels and DeepEP's
//                 low-latency kernels do.
//   hierarchical: one transfer per (token, destination node), to the rank there with this rank's
//                 local index (the relay), which forwards it by load/store to the ranks of its node
//                 that need it, as DeepEP's normal kernels do: fewer network bytes at top-8.
// Both give the same bits. Combine returns rows directly in both unless combine_sums_in_node is
// set (docs/gpu-all-to-all.md).
enum class CrossNode : uint8_t { direct, hierarchical };

// The names these fields had before MoeShape stay one release as deprecated aliases: a config
// that sets one (and not the new name) is read as if it had set the new one. Their own uses warn;
// the struct's implicit members, which copy them, must not.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
// The exchange's dimensions are its MoeShape: max_tokens per rank per call (>= 1), num_experts
// (global, divisible by the world size), top_k (1..num_experts) and hidden_dim (elements a row).
struct AllToAllConfig : MoeShape {
  DType in_dtype = DType::bf16;  // dispatch payload: f32, bf16, f16 or f8e4m3
  int scale_block = 0;        // f8e4m3 only: elements per f32 scale; hidden_dim % scale_block == 0
  DType out_dtype = DType::bf16;  // combine output: f32, bf16 or f16
  // Also allocate input_buffer() and expert_output_buffer() in symmetric memory, so that peers
  // on this node read tokens and expert outputs in place instead of through a staging copy.
  bool in_place_buffers = false;
  // CPU backend only. Lay expert_x (dispatch) and expert_y (combine) out packed: the rows of
  // local expert e are flat rows [o_e, o_e + expert_num_tokens[e]) of the [E_local * W *
  // max_tokens, H] buffer, o_e the sum of the counts of experts before e, instead of rows
  // [0, count) of its own [W * max_tokens, H] block. A caller that wants the arrived rows
  // contiguous (an expert-parallel layer handing them to experts_forward) then reads them in
  // place instead of gathering them. A rank's own layout: ranks may differ. expert_x,
  // expert_x_scale and expert_y may then also be 2-D, [R, H] (R rows of any number): a caller
  // that asks arriving_rows() between dispatch(send) and dispatch(recv) can land the rows in a
  // buffer of exactly their size, as DeepEP's dispatch sizes recv_x from its counts exchange.
  bool packed_expert_rows = false;
  // Ranks per node, to split this machine's ranks into several nodes (0: no split). A peer on
  // another node of the split is reached by puts and signals only, never loads and stores, as
  // across real nodes. Must divide the world size.
  int ranks_per_node = 0;
  // CUDA backend only; hierarchical needs ranks_per_node set (the GPUs of a node, consecutive
  // ranks), since the relay of a node is found from it.
  CrossNode cross_node = CrossNode::direct;
  // Hierarchical mode only (needs cross_node = hierarchical, CUDA backend): combine sums each
  // token's rows within every remote node before they cross the network. Node n's relay for a
  // source (the rank that forwarded its tokens in dispatch) adds the rows of n's experts for each
  // token, w[t, j] * row in f32 over j ascending, rounds the sum once to expert_y's dtype and puts
  // ONE row per (token, node); the source adds the node partials in ascending node order (its own
  // node's in f32) and rounds once to out_dtype. Fewer network bytes at top-k > 1, but the sum
  // order, and with it the low bits of y, now depend on the node split (docs/gpu-all-to-all.md,
  // "Node-summed combine"). Off by default: the default is bit-identical across node splits.
  bool combine_sums_in_node = false;
  // Logical experts on physical slots (pmoe/placement.hpp). Empty: indices name the slots
  // (num_experts of them). Set: indices name logical experts in [0, num_logical_experts), each
  // routed to one of its slots on a live rank by a fixed rule (src/all_to_all/slot_routing.hpp),
  // and expert_x / expert_y rows are the slots'. Every backend; direct mode only.
  ExpertPlacement placement{};
  // The op keeps a mask of live ranks (mask_rank()), which every call reads: on a GPU from
  // device memory, so that a captured CUDA graph follows it. A masked rank takes no token and is
  // waited for by no one. Direct mode without a node split only.
  bool rank_mask = false;
  // What a token's slot becomes when its expert has no live slot left (pmoe/placement.hpp).
  MaskedExperts masked_experts = MaskedExperts::drop;
  // On a lost peer: fail, or mask it and go on (implies rank_mask). mask needs every rank on
  // this node (their memory load/store reachable) and, so far, the CPU backend.
  OnPeerLoss on_peer_loss = OnPeerLoss::fail;
  // mask: a peer awaited this long, or silent this long while the survivors agree, is lost. It
  // must exceed the longest time a live rank spends between two waits of the op (its expert
  // compute, or a pause between calls), or that rank is masked too. 0: the communicator's
  // timeout (PMOE_TIMEOUT_S, 60 s by default).
  double peer_timeout_s = 0;

  // Throws pmoe::Error saying what to change if the config cannot run on `world_size` ranks.
  void validate(int world_size) const;
  int scales_per_token() const { return scale_block > 0 ? hidden_dim / scale_block : 0; }
  // The op keeps a rank mask: asked for, or implied by on_peer_loss = mask.
  bool maskable() const { return rank_mask || on_peer_loss == OnPeerLoss::mask; }
  const MoeShape& shape() const { return *this; }
  MoeShape& shape() { return *this; }

  // Deprecated aliases of max_tokens and top_k: read only where the new name is left 0.
  [[deprecated("use max_tokens")]] int max_num_tokens = 0;
  [[deprecated("use top_k")]] int experts_per_token = 0;
  // This config with each deprecated alias moved to its new name where that is 0, and the
  // aliases cleared: what AllToAll keeps. validate() refuses an alias that disagrees with a set
  // new name.
  AllToAllConfig with_current_names() const;
};
#pragma GCC diagnostic pop

// Split phases: `send` starts the exchange and returns; `recv` completes it. Work may run between
// the two, and one thread may drive several ranks (all ranks' send, then all ranks' recv). On one
// rank, calls alternate dispatch(send) -> dispatch(recv) -> combine(send) -> combine(recv);
// `both` is a send followed by a recv. Every phase takes the same, complete argument list.
enum class Phase : uint8_t { send, recv, both };

namespace detail {
class AllToAllBackend;
class LossBoard;
struct PeerLossNoticed;
class SlotTable;
enum class Step : int32_t;  // the steps of a round (src/all_to_all/step.hpp)
}

class AllToAll {
 public:
  // Collective over `comm`: allocates the symmetric buffers, sized once from `config`, on the
  // communicator's device (the CPU, or the GPU of run_ranks(n, fn, Device::cuda(i))).
  AllToAll(Communicator& comm, const AllToAllConfig& config);
  // The same, naming the device, which must be the communicator's.
  AllToAll(Communicator& comm, const AllToAllConfig& config, Device device);
  // on_peer_loss = mask, in a new process that takes lost rank r's place (its communicator made
  // by SocketCommunicator::replacing), while every survivor calls admit(r) on its op: the same
  // config is checked against theirs (pmoe::Error on every rank if it differs), each of the op's
  // allocations takes over r's memory instead of allocating, and the op then joins as rejoin()
  // does: its first call is the one the survivors make next. Bounded as rejoin() is.
  struct Replacing {};
  AllToAll(Communicator& comm, const AllToAllConfig& config, Replacing);
  ~AllToAll();
  AllToAll(const AllToAll&) = delete;
  AllToAll& operator=(const AllToAll&) = delete;

  // x                 [m, H] in_dtype, 0 <= m <= max_tokens (m may differ between ranks)
  // x_scale           [m, H / scale_block] f32 for f8e4m3 input; an empty Tensor otherwise
  // indices           [m, k] i32 or i64 (as torch.topk returns), each in [0, E) or -1 (slot
  //                   skipped); no expert twice in a row. With a placement, logical experts:
  //                   [0, placement.num_logical_experts) or -1
  // expert_num_tokens [E_local] i32, out: rows received per local expert
  // expert_x          [E_local, W * max_tokens, H] in_dtype, out: the first
  //                   expert_num_tokens[e] rows of expert e (with packed_expert_rows: the
  //                   experts' rows back to back from flat row 0); other rows left untouched.
  //                   With packed_expert_rows it may be [R, H]: dispatch(recv) and
  //                   Phase::both need R >= the rows that arrive, arriving_rows() if it was
  //                   asked this call, else the most that can (W * max_tokens *
  //                   min(k, E_local)); dispatch(send), which writes no row, takes any R
  // expert_x_scale    [E_local, W * max_tokens, H / scale_block] f32 (f8e4m3), else empty
  // bound_m           optional [1] i32 on the op's device: the number of tokens this call,
  //                   <= the rows of x, read where the op runs (by the kernels on a GPU), so
  //                   that a captured CUDA graph can be replayed with another m
  // After dispatch(send) returns, x, x_scale and indices may be overwritten (on a GPU: once the
  // stream has passed the send).
  void dispatch(const Tensor& x, const Tensor& x_scale, const Tensor& indices,
                const Tensor& expert_num_tokens, const Tensor& expert_x,
                const Tensor& expert_x_scale, Phase phase = Phase::both,
                const Tensor& bound_m = Tensor());

  // expert_y [E_local, W * max_tokens, H] f32, bf16 or f16, rows in dispatch's order and
  //          layout (packed_expert_rows: back to back, and it may be [R, H] with R >= the
  //          rows the matching dispatch received)
  // indices  [m, k] i32 or i64, the same values as given to the matching dispatch
  // weights  [m, k] f32
  // y        [m, H] out_dtype, out: y[t] = sum over j of weights[t, j] * (expert_y row of token t
  //          at expert indices[t, j]), in f32, in j order, skipping -1 slots
  // bound_m  as for dispatch (the same value)
  // After combine(send) returns, expert_y may be overwritten.
  void combine(const Tensor& expert_y, const Tensor& indices, const Tensor& weights,
               const Tensor& y, Phase phase = Phase::both, const Tensor& bound_m = Tensor());

  // packed_expert_rows only, between dispatch(send) and dispatch(recv): waits (bounded, as
  // dispatch(recv) does) until every peer has sent, and returns the rows this rank's
  // dispatch(recv) will write, the sum of expert_num_tokens. A failed wait retires the op.
  int64_t arriving_rows();

  // On a GPU the kernels check what the host cannot see (indices in device memory, peers that
  // never arrive) and record the first error, which this raises; run it after synchronizing the
  // stream. Throws pmoe::Error. A peer that never arrived or an expert_y dtype that differs
  // between ranks breaks the protocol: that error stays, every later call raises it at entry,
  // and the op is retired (build a new one), as after a failed wait on the CPU. A bad index or
  // bound_m does not: every rank finishes its call (dispatch and combine both skip the slot,
  // m is clamped), the error is raised once, here, on the rank that passed it, and the op goes
  // on. With on_peer_loss = mask, a peer the kernels found lost (or another survivor did) is
  // raised as pmoe::PeerLost, as the next call would raise it: the survivors have agreed and
  // masked it, and this rank's calls it names are lost. A no-op on the CPU, where every error is
  // raised by the call that meets it.
  void check_errors();

  // In-place buffers (config.in_place_buffers): memory of this op that peers on the same node
  // can read directly. Passing a view of the first m rows of input_buffer() (and of
  // input_scale_buffer() for f8e4m3) as `x`, or expert_output_buffer() as `expert_y`, saves one
  // copy of every token or expert row. The price is a longer lifetime: the in-place `x` must
  // stay unchanged from dispatch(send) until this rank's combine(recv) returns (peers read it
  // during their dispatch(recv)); the in-place `expert_y` from combine(send) until this rank's
  // next dispatch(recv) returns (peers read it during their combine(recv)). In an MoE layer,
  // where the next input is written after combine and expert outputs after dispatch, both hold.
  // Throw pmoe::Error if the config did not ask for them.
  Tensor input_buffer() const;         // [max_tokens, H] in_dtype
  Tensor input_scale_buffer() const;   // [max_tokens, H / scale_block] f32 (f8e4m3 only)
  Tensor expert_output_buffer() const; // [E_local, W * max_tokens, H] out_dtype

  // Masks `rank` (config.rank_mask): from this rank's next dispatch on, no token goes to its
  // slots (each goes to a live replica of its expert, or is dropped as config.masked_experts
  // says) and no wait waits for it. Every live rank calls it between two calls (after its
  // combine(recv), before its next dispatch), with the same rank, and the masked rank calls the
  // op no more. Throws pmoe::Error, changing nothing, for a rank out of range, this rank, or the
  // last live rank but this one.
  void mask_rank(int rank, const std::string& reason);
  // on_peer_loss = mask: takes a masked `rank` back. Every live rank calls it between the same
  // two calls, with the same rank, while `rank` calls rejoin(); it waits (bounded by the peer
  // timeout plus the communicator's) until `rank` is joining, and from this rank's next dispatch
  // on its slots serve again. Throws pmoe::Error, changing nothing, for a rank that is live, out
  // of range, or that does not join in time.
  void unmask_rank(int rank);
  // on_peer_loss = mask, on a rank the others masked (it stopped, was held lost, or was drained):
  // waits (bounded as unmask_rank) until every live rank has unmasked it, takes their mask and
  // call count, and makes the op usable again, between calls. Its next call is the one the
  // others make next.
  void rejoin();
  // on_peer_loss = mask, on every survivor, after SocketCommunicator::admit(rank): a new process
  // builds the op in `rank`'s place (the Replacing constructor). Checks its config against this
  // rank's, hands it the op's memory (its own allocation is the lost rank's), then does what
  // unmask_rank does. Between calls, with the same rank on every survivor. Throws pmoe::Error,
  // changing nothing, for a rank that is live or out of range, an op not made with
  // on_peer_loss = mask, a CUDA device (not built yet), or a newcomer whose config differs.
  void admit(int rank);
  // on_peer_loss = mask: another op of this rank raised pmoe::PeerLost for `ranks` (two
  // exchanges that take turns, as EpMoe's micro-batches do): this one goes on without them too,
  // abandoning its call in flight if any. Collective over the survivors, each of which calls it
  // or finds the loss itself. Throws the PeerLost this op's own call would have raised, naming
  // its lost calls; returns at once where `ranks` are masked here already.
  void go_on_without(const std::vector<int>& ranks);
  // The live ranks and the reason each masked one was masked.
  const RankMask& rank_mask() const { return mask_; }
  // Logical experts (slots, without a placement) that no live rank serves now, ascending.
  std::vector<int> lost_experts() const;
  // The number of the last call begun (its dispatch(send)); calls are numbered from 1, the same
  // on every rank. After a pmoe::PeerLost it is the number the survivors agreed on, so that the
  // next call has the same number everywhere.
  int64_t calls_started() const { return calls_started_; }

  // Bytes this op allocated per rank (symmetric buffers, signals and private staging).
  size_t workspace_bytes() const;
  // What this rank has sent to peers on other nodes (AllToAllConfig::ranks_per_node, or real
  // nodes) since the op was made: payload bytes and transfers (puts and lone signals). Zero on
  // one node.
  struct RemoteTraffic {
    uint64_t bytes = 0, transfers = 0;
  };
  RemoteTraffic remote_traffic() const;
  const AllToAllConfig& config() const { return config_; }
  int num_local_experts() const { return num_local_experts_; }
  int world_size() const { return world_size_; }

 private:
  using Step = detail::Step;  // src/all_to_all/step.hpp
  void agree_on_config(Communicator& comm, const AllToAllConfig& config, Device device) const;
  void enter(Step step, const char* op);  // checks the phase order
  void run_step(Step step, const char* op, const std::function<void()>& body);
  // The tokens this call: `rows`, or *bound_m where the host can read it (validated).
  int64_t tokens_this_call(const char* op, int64_t rows, const Tensor& bound_m) const;
  void dispatch_impl(const Tensor& x, const Tensor& x_scale, const Tensor& indices,
                     const Tensor& expert_num_tokens, const Tensor& expert_x,
                     const Tensor& expert_x_scale, Phase phase, const Tensor& bound_m);
  void combine_impl(const Tensor& expert_y, const Tensor& indices, const Tensor& weights,
                    const Tensor& y, Phase phase, const Tensor& bound_m);
  // The CPU's: the first m rows of idx32 as slots, and `weights` as combine must use them (into
  // *weights_out, when given), where the slot table rewrites indices; idx32 itself where not.
  Tensor slots_on_host(const Tensor& idx32, int64_t m, const Tensor& weights,
                       Tensor* weights_out);
  // Runs a call: a pmoe::Error thrown before its first step started is a rejection, which the
  // communicator posts for peers that will wait for this rank (Communicator::note_rejection).
  void guarded(const std::function<void()>& call);
  // Runs a step's (or arriving_rows()') exchange: a failed wait retires the op, and a lost peer
  // (on_peer_loss = mask) leads to the survivors' agreement and a pmoe::PeerLost.
  void exchange(const std::function<void()>& body);
  [[noreturn]] void agree_and_restart(const detail::PeerLossNoticed& noticed);
  [[noreturn]] void retire_excluded(const std::string& why);
  // `indices` as i32: itself, or its i64 values narrowed into `storage` (after their check).
  Tensor indices_i32(const char* op, const Tensor& indices, std::vector<int32_t>& storage) const;
  // expert_x, expert_x_scale or expert_y: [E_local, W * max_tokens, width], or with
  // packed_expert_rows also [R, width] with R >= min_rows (the reason names where it comes from).
  void check_expert_rows(const char* op, const char* name, const Tensor& t, DType dtype,
                         int64_t width, int64_t min_rows, const char* reason) const;

  AllToAllConfig config_;
  Communicator* comm_ = nullptr;
  bool started_ = false;  // the current call has begun its first step (its checks passed)
  int rank_ = 0;
  int world_size_ = 1;
  int num_local_experts_ = 0;
  Device device_;
  Step next_{};  // dispatch(send)
  std::vector<int32_t> routed_indices_;  // dispatch(send)'s indices, which combine must repeat
  std::vector<int32_t> dispatch_indices_, combine_indices_;  // narrowed i64 indices
  DType sent_expert_y_dtype_ = DType::f32;  // combine(send)'s, which combine(recv) must repeat
  int64_t arriving_ = -1;  // arriving_rows() of this call; -1 if not asked
  int64_t arrived_ = 0;    // rows the last dispatch(recv) wrote (packed expert_y's minimum)
  std::string broken_;  // set once a wait failed: the protocol state is lost, the op unusable
  RankMask mask_;
  std::unique_ptr<detail::SlotTable> slot_table_;  // logical experts to live slots
  std::vector<int32_t> routed_slots_;   // the CPU's: this call's indices as slots
  std::vector<float> routed_weights_;   // the CPU's: combine's weights after the mask
  int64_t calls_started_ = 0;  // dispatch(send)s begun (the current call's number)
  int64_t calls_done_ = 0;     // combine(recv)s finished
  int64_t restarted_at_ = 0;   // calls_started_ agreed by the last agreement on a lost peer
  std::unique_ptr<detail::LossBoard> loss_board_;  // on_peer_loss = mask
  std::unique_ptr<detail::AllToAllBackend> backend_;
};

}  // namespace pmoe
