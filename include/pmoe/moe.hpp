// MoE layers: the router, the experts, and three ways to place a layer on ranks.
//
//   y[t] = sum over j < top_k of weight[t, j] * FFN_{expert[t, j]}(x[t])
//   FFN_e(v) = act(v . W1_e) . W2_e          (swiglu: (silu(v . W1_e) * (v . W1b_e)) . W2_e)
//
// The router picks each token's top_k experts by logit (x . Wg) and weighs them with the softmax
// of those k logits. Every weight is a pure function of (config.seed, tensor, expert, row, column)
// (moe_weight()), so every rank and every variant builds the same model without communicating,
// and SimpleMoe, TpMoe and EpMoe give the same outputs up to the dtype's rounding.
//
//   SimpleMoe  one rank holds the whole model and runs all tokens
//   TpMoe      every expert split over the W ranks (W1 by columns, W2 by rows); tokens
//              replicated; one all-reduce of the layer output per forward
//   EpMoe      E / W whole experts per rank, tokens sharded; AllToAll dispatch, one GEMM per local
//              expert over the rows it received, AllToAll combine; micro_batches = 2 splits the
//              tokens in two halves so that one half's exchange waits while the other's experts run
//
// All CPU GEMMs go through BLAS (src/cpu/gemm.hpp) in f32. Constructors and forward() validate
// everything before a byte leaves the rank and throw pmoe::Error saying what to change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pmoe/comm.hpp"
#include "pmoe/dtype.hpp"
#include "pmoe/placement.hpp"
#include "pmoe/shape.hpp"
#include "pmoe/tensor.hpp"

namespace pmoe {

enum class Activation : uint8_t {
  relu,    // max(0, v): the seed's
  gelu,    // v * Phi(v), the exact (erf) form
  swiglu,  // silu(v . W1) * (v . W1b): W1 has two halves, the gate and the linear part
};
std::string_view activation_name(Activation act);
// "relu", "gelu" or "swiglu"; throws pmoe::Error on anything else.
Activation parse_activation(std::string_view name);

// feature_dim, hidden_dim's name before MoeShape, stays one release as a deprecated alias; the
// struct's implicit members, which copy it, must not warn.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
struct MoeConfig {
  int hidden_dim = 0;   // H: input width, >= 1
  int ffn_dim = 0;      // F: expert hidden width, >= 1
  int output_dim = 0;   // O: expert output width; 0 means hidden_dim (the seed used 64 != 32)
  int num_experts = 0;  // E >= 1
  int top_k = 0;        // experts per token, 1..E
  Activation act = Activation::relu;
  // f32 or bf16: the inputs and outputs of forward(), what travels between ranks, and the values
  // of the weights (on the CPU, bf16 values kept in f32, because BLAS computes in f32; on a CUDA
  // device, stored in bf16 for bf16 tensor-core GEMMs).
  DType dtype = DType::f32;
  uint64_t seed = 0;  // the weights (and nothing else)
  // CUDA devices only (the CPU layers ignore both):
  // tf32: an f32 layer's expert GEMMs on TF32 tensor cores (inputs rounded to 10 mantissa bits,
  // f32 accumulation). Off by default: f32 experts then compute in f32. A bf16 layer always runs
  // bf16 tensor-core GEMMs (bf16 weights and inputs, f32 accumulation), so tf32 is f32-only.
  bool tf32 = false;
  // device_stats: forward() also records what only the device can count (phase events, EpMoe's
  // traffic, the expert rows in use), for last_stats(). Off by default: a forward then launches
  // and records nothing for statistics, and last_stats() holds only the host-known fields.
  bool device_stats = false;

  int out_dim() const { return output_dim > 0 ? output_dim : current_hidden_dim(); }
  // 2 for swiglu (gate and linear halves of W1), else 1.
  int w1_halves() const { return act == Activation::swiglu ? 2 : 1; }
  // The exchange's dimensions of a layer that takes up to max_tokens tokens a rank per forward:
  // what EpMoe hands its AllToAll, whole.
  MoeShape shape(int max_tokens) const {
    return {max_tokens, num_experts, top_k, current_hidden_dim()};
  }
  // Throws pmoe::Error saying what to change if no layer can be built from this config.
  void validate() const;

  // Deprecated alias of hidden_dim: read only where hidden_dim is left 0.
  [[deprecated("use hidden_dim")]] int feature_dim = 0;
  // hidden_dim, or feature_dim where hidden_dim is left 0: what out_dim() and shape() read, so
  // that a config written with the old name answers them as it did.
  int current_hidden_dim() const { return hidden_dim > 0 ? hidden_dim : feature_dim; }
  // This config with feature_dim moved to hidden_dim where that is 0, and cleared: what the
  // layers keep. validate() refuses a feature_dim that disagrees with a set hidden_dim.
  MoeConfig with_current_names() const;
};
#pragma GCC diagnostic pop

// The weight tensors of the model, for moe_weight().
enum class MoeTensor : uint8_t {
  router,     // Wg [hidden_dim, num_experts] (the expert argument is ignored)
  w1,         // W1_e [hidden_dim, ffn_dim]; for swiglu the gate half
  w1_linear,  // W1b_e [hidden_dim, ffn_dim]; swiglu's linear half
  w2,         // W2_e [ffn_dim, out_dim]
};

// Element (row, col) of a weight tensor of `config`'s model: uniform in [-a, a) with
// a = sqrt(3 / rows of the tensor) (unit variance in, unit variance out), rounded to
// config.dtype. A pure function: the same arguments always give the same value.
float moe_weight(const MoeConfig& config, MoeTensor tensor, int expert, int64_t row, int64_t col);

// What the last forward() did on this rank, for benchmarks: its work, its traffic and where its
// time went. Times are wall-clock seconds on this rank. On a CUDA device, forward() does not
// wait for its work; with MoeConfig::device_stats, last_stats() waits for what the device
// counts itself (the phase times, EpMoe's bytes_moved, the expert rows in use and live), and
// without it those stay 0, as for a forward captured in a CUDA graph.
struct MoeStats {
  int64_t tokens = 0;       // tokens this rank routed
  int64_t expert_rows = 0;  // (token, expert) rows this rank's expert GEMMs were issued
  // Of those, the rows in use (tokens this rank's experts serve) and the rows of the tiles that
  // hold them (a device pads each expert's rows to whole GEMM tiles). The CPU computes exactly
  // the rows in use: all three are equal there. On a device, the two below are counted only with
  // device_stats, and then expert_rows is what the GEMMs counted (bf16: the live tiles' rows; f32:
  // cuBLAS's batch, sized from a bound the host knows); without, expert_rows is that bound.
  int64_t expert_rows_used = 0;
  int64_t expert_rows_live = 0;
  double expert_flops = 0;  // GEMM FLOPs of those rows (2 per multiply-add)
  double router_flops = 0;  // GEMM FLOPs of the router logits
  // This rank's share of the traffic between ranks, so that the sum over ranks is the total:
  // EpMoe: its tokens' payloads to other ranks plus their expert rows back from other ranks;
  // TpMoe: what it sends in the all-reduce (it receives as much). SimpleMoe: 0. A device EpMoe
  // with a placement or a rank mask counts nothing here (0).
  int64_t bytes_moved = 0;
  double route_s = 0;     // router, and for EpMoe staging the tokens
  double dispatch_s = 0;  // EpMoe: AllToAll dispatch, send and recv
  double experts_s = 0;   // the expert stage: gathers, GEMMs, activations
  double combine_s = 0;   // EpMoe: AllToAll combine; SimpleMoe and TpMoe: the weighted sum
  double reduce_s = 0;    // TpMoe: the all-reduce
  // A device layer's expert GEMMs, in words: the library's grouped GEMM (CUTLASS sm90 or sm80),
  // pmoe's own grouped GEMM, or cuBLAS's batch; both GEMMs' where they differ. "" on the CPU.
  std::string expert_gemm;
};

// The split of `rows` tokens over `world_size` ranks that EpMoe's callers use: rank r gets
// [begin, end), the first rows % world_size ranks one row more than the others.
struct RowRange {
  int begin = 0, end = 0;
  int size() const { return end - begin; }
};
RowRange shard_rows(int rows, int world_size, int rank);

// The router: logits = x . Wg [hidden_dim, num_experts]; each token's top_k experts by
// descending logit (ties to the lower expert), weighted by the softmax of those k logits.
class Router {
 public:
  explicit Router(const MoeConfig& config);  // builds Wg from config.seed; validates config
  // x [m, hidden_dim] f32 or bf16 (rows may be strided); indices [m, top_k] i32 (out);
  // weights [m, top_k] f32 (out), summing to 1 per token. Computed in f32. Throws pmoe::Error
  // on a wrong shape, dtype or device.
  void route(const Tensor& x, const Tensor& indices, const Tensor& weights);
  size_t weight_bytes() const;
  size_t workspace_bytes() const { return logits_.nbytes(); }
  double flops(int64_t tokens) const;  // GEMM FLOPs of the logits of `tokens` tokens

 private:
  MoeConfig config_;
  Buffer weights_;  // Wg [H, E] f32
  Buffer logits_;   // [m, E] f32, grown on demand
};

// A set of experts, each possibly restricted to a slice of its hidden columns: experts
// [first_expert, first_expert + count), hidden columns [ffn_begin, ffn_end) (all of them,
// 0..ffn_dim, for SimpleMoe and EpMoe; one rank's shard for TpMoe, whose outputs are then
// partial sums that add up over the shards).
class Experts {
 public:
  Experts(const MoeConfig& config, int first_expert, int count, int ffn_begin, int ffn_end);
  // The same for any list of experts: local expert i is expert experts[i] (an EpMoe rank's slots
  // under a placement, where replicas repeat an expert).
  Experts(const MoeConfig& config, const std::vector<int>& experts, int ffn_begin, int ffn_end);
  ~Experts();
  Experts(Experts&&) noexcept;
  Experts& operator=(Experts&&) noexcept;

  // y = act(x . W1_e[:, slice]) . W2_e[slice, :] for local expert `local` (expert
  // first_expert + local). x [rows, hidden_dim] and y [rows, out_dim] are f32 or bf16, rows may
  // be strided (unit stride in the last dimension); computed in f32, y rounded once. Throws
  // pmoe::Error on a wrong expert, shape, dtype or device.
  void forward(int local, const Tensor& x, const Tensor& y);

  int first_expert() const { return first_; }
  int count() const { return count_; }
  size_t weight_bytes() const;
  size_t workspace_bytes() const;
  double flops(int64_t rows) const;  // GEMM FLOPs of forward() over `rows` rows

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int first_ = 0, count_ = 0;
};

class SimpleMoe {
 public:
  // The whole model on this rank, for up to max_tokens tokens per forward, on the CPU.
  SimpleMoe(const MoeConfig& config, int max_tokens);
  // The same on `device`; on a CUDA device, forward() enqueues its work on `stream` (the null
  // Stream: the device's legacy default stream) and returns: y is ready in stream order.
  SimpleMoe(const MoeConfig& config, int max_tokens, Device device, Stream stream = Stream());
  ~SimpleMoe();

  // x [m, hidden_dim] config.dtype, 0 <= m <= max_tokens; y [m, out_dim] config.dtype (out);
  // both contiguous and on the layer's device (pmoe::Error naming the tensor otherwise).
  void forward(const Tensor& x, const Tensor& y);

  const MoeConfig& config() const;
  Device device() const;
  size_t weight_bytes() const;     // router and experts
  size_t workspace_bytes() const;  // everything else this layer holds
  const MoeStats& last_stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class TpMoe {
 public:
  // Collective over comm: rank r holds hidden columns [r F / W, (r + 1) F / W) of every expert
  // (config.ffn_dim % W == 0) and the whole router.
  TpMoe(Communicator& comm, const MoeConfig& config, int max_tokens);
  ~TpMoe();

  // Collective. x [m, hidden_dim] config.dtype, the same tokens on every rank (TP replicates
  // them), 0 <= m <= max_tokens; y [m, out_dim] config.dtype (out), the same bits on every rank.
  // One all-reduce of the f32 partial outputs per call, summed in rank order. A rank that
  // receives partials for another m than its own throws pmoe::Error naming both counts. On a
  // CUDA device the counts are compared on the device (no host round trip): a call with
  // differing counts sums nothing (y is left as it was), and this rank's next forward throws that
  // error at entry, before it launches anything, once; the layer then goes on. The error is seen
  // at the latest once the host has synchronised the rank's stream.
  void forward(const Tensor& x, const Tensor& y);

  const MoeConfig& config() const;
  size_t weight_bytes() const;
  size_t workspace_bytes() const;  // includes the all-reduce buffers
  const MoeStats& last_stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// EpMoe's choices beyond the layer's shape.
struct EpMoeOptions {
  int micro_batches = 1;  // 1 or 2
  // Expert slots (pmoe/placement.hpp): S = placement.slot_expert.size() slots, S / W a rank,
  // slot s serving expert slot_expert[s] of config.num_experts (placement.num_logical_experts
  // must equal it), with its weights. Replicas spread the load, and keep every token when a
  // masked rank held one of them. Empty: rank r holds experts [r E / W, (r + 1) E / W).
  ExpertPlacement placement{};
  bool rank_mask = false;  // the layer can mask ranks (mask_rank), as AllToAllConfig::rank_mask
  MaskedExperts masked_experts = MaskedExperts::drop;  // an expert with no live slot
  // As AllToAllConfig::on_peer_loss and peer_timeout_s: with mask, the forward in which the
  // survivors find a rank lost throws pmoe::PeerLost (its y must not be used: run the tokens
  // again; on a GPU check_errors() may raise it after the stream, for the forward just run),
  // and the next forward runs without that rank, in both micro-batches' exchanges.
  OnPeerLoss on_peer_loss = OnPeerLoss::fail;
  double peer_timeout_s = 0;
};

class EpMoe {
 public:
  // Collective over comm: rank r owns experts [r E / W, (r + 1) E / W) (config.num_experts % W
  // == 0) and the whole router. micro_batches is 1 or 2.
  EpMoe(Communicator& comm, const MoeConfig& config, int max_tokens,
        int micro_batches = 1);
  // The same with a placement or a maskable exchange (EpMoeOptions).
  EpMoe(Communicator& comm, const MoeConfig& config, int max_tokens,
        const EpMoeOptions& options);
  ~EpMoe();

  // options.rank_mask only: as AllToAll::mask_rank, for every exchange of the layer. Every live
  // rank calls it between two forwards with the same rank; the masked rank calls forward no more.
  void mask_rank(int rank, const std::string& reason);
  // options.on_peer_loss = mask only: as AllToAll::unmask_rank and rejoin, for the layer's
  // exchange. A rank that rejoins builds the same weights it had (they follow config.seed).
  void unmask_rank(int rank);
  void rejoin();
  const RankMask& rank_mask() const;
  std::vector<int> lost_experts() const;  // logical experts no live rank serves now

  // Collective: every rank calls it, once per layer step. x [m, hidden_dim] config.dtype: this
  // rank's tokens, 0 <= m <= max_tokens (m may differ between ranks); y [m, out_dim]
  // config.dtype (out). Arguments are checked before anything is sent; a rejected call throws
  // pmoe::Error and leaves the layer usable.
  void forward(const Tensor& x, const Tensor& y);
  // On a GPU a forward returns before its kernels ran. After synchronizing the stream, this
  // raises what they recorded (AllToAll::check_errors for each exchange), pmoe::PeerLost
  // included: a forward whose exchange lost a peer is known before its output is used. A no-op
  // on the CPU, whose forward raises everything itself.
  void check_errors();

  const MoeConfig& config() const;
  int micro_batches() const;
  size_t weight_bytes() const;
  size_t workspace_bytes() const;  // includes the AllToAll buffers
  const MoeStats& last_stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pmoe
