#include "all_to_all_cases.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "pmoe/error.hpp"
#include "all_to_all/layout.hpp"
#include "all_to_all/route.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {

using reference::AllToAllInputs;

AllToAllConfig make_config(int max_tokens, int experts, int top_k, int hidden, DType in,
                           DType out, int scale_block) {
  AllToAllConfig c;
  c.max_tokens = max_tokens;
  c.num_experts = experts;
  c.top_k = top_k;
  c.hidden_dim = hidden;
  c.in_dtype = in;
  c.out_dtype = out;
  c.scale_block = scale_block;
  return c;
}

std::string describe(const AllToAllCase& c) {
  const AllToAllConfig& g = c.config;
  return detail::cat("max_tokens=", g.max_tokens, " E=", g.num_experts,
                     " k=", g.top_k, " H=", g.hidden_dim, " in=",
                     dtype_name(g.in_dtype), " out=", dtype_name(g.out_dtype),
                     " expert_y=", c.in_place ? "in place" : dtype_name(c.expert_y_dtype),
                     " seed=", c.seed);
}

namespace {

constexpr uint8_t kSentinel = 0xA5;

int tokens_for(const AllToAllCase& c, int rank, int call) {
  const int max = c.config.max_tokens;
  const uint64_t h = reference::hash64(c.seed, 0x70c, uint64_t(rank), uint64_t(call));
  switch (c.tokens) {
    case TokenCounts::full: return max;
    case TokenCounts::random: return int(h % uint64_t(max + 1));
    case TokenCounts::zero_on_odd: return rank % 2 ? 0 : 1 + int(h % uint64_t(max));
  }
  return max;
}

// FNV-1a over a tensor's bytes, folded into `digest`.
void fold(uint64_t& digest, const Tensor& t) {
  const auto* p = t.data<uint8_t>();
  for (size_t i = 0; i < t.nbytes(); ++i) digest = (digest ^ p[i]) * 0x100000001b3ull;
}

// Work placed between send and recv, as a caller overlapping compute would.
float busy_work(int rank) {
  float acc = float(rank);
  for (int i = 0; i < 20000; ++i) acc = acc * 0.999f + 1.0f;
  return acc;
}

// Unit roundoff (half an ulp at 1) of a float dtype: 2^-p for p significand bits.
double unit_roundoff(DType dtype) {
  return dtype == DType::bf16 ? 0x1p-8 : dtype == DType::f16 ? 0x1p-11 : 0x1p-24;
}

// Node-summed combine (config.combine_sums_in_node) against the reference: y within a bound,
// element by element. Both sum the same f32 products a_j = w_j * v_j (v_j: the expert row in
// expert_y's dtype); let S = sum_j |a_j|, u = 2^-24 (f32), u_y and u_out the unit roundoffs of
// expert_y's and y's dtypes, N the nodes. The reference adds the k products in j order: at most
// (k - 1) u S from the exact sum. Node sum: each node's sum of its n_i products, at most
// (n_i - 1) u S_i; a remote node's rounded to expert_y's dtype, u_y |P_i| <= u_y S_i (1 + k u);
// the N partials added, (N - 1) u S (1 + u_y): at most (u_y + (k + N) u)(1 + u_y) S in all. The
// two f32 values differ by d <= (u_y + (2k + N) u)(1 + u_y) S; rounded to y's dtype, each moves
// by at most half an ulp of it: |y - y_ref| <= d + 2 u_out (max |y| + d), plus the smallest
// subnormal step of y's dtype where the values are subnormal. Returns "" or the first breach.
std::string compare_node_summed(const AllToAllConfig& cfg, const reference::AllToAllInputs& mine,
                                DType expert_y_dtype, int world_size, const Tensor& y) {
  const int H = cfg.hidden_dim, k = cfg.top_k, S = cfg.scales_per_token();
  const int nodes = world_size / cfg.ranks_per_node;
  const size_t row_bytes = size_t(H) * dtype_size(cfg.in_dtype);
  const double u = 0x1p-24, u_y = unit_roundoff(expert_y_dtype);
  const double u_out = unit_roundoff(cfg.out_dtype);
  const double tiny = cfg.out_dtype == DType::f16    ? 0x1p-24
                      : cfg.out_dtype == DType::bf16 ? 0x1p-133
                                                     : 0x1p-149;
  for (int t = 0; t < mine.m; ++t) {
    const auto* x = mine.x.data<std::byte>() + t * row_bytes;
    const float* scales = S ? mine.x_scale.data<float>() + t * S : nullptr;
    for (int h = 0; h < H; ++h) {
      float acc = 0.0f;
      double magnitude = 0;
      for (int j = 0; j < k; ++j) {
        const int expert = mine.indices.data<int32_t>()[t * k + j];
        if (expert < 0) continue;
        const float out = reference::expert_fn(reference::token_value(cfg, x, scales, h), expert);
        const float v = visit_float_dtype(
            expert_y_dtype, [&](auto tag) { return to_float(from_float<decltype(tag)>(out)); });
        const float a = mine.weights.data<float>()[t * k + j] * v;
        acc += a;
        magnitude += std::fabs(double(a));
      }
      const float want = visit_float_dtype(
          cfg.out_dtype, [&](auto tag) { return to_float(from_float<decltype(tag)>(acc)); });
      const float got = visit_float_dtype(cfg.out_dtype, [&](auto tag) {
        return to_float(y.data<decltype(tag)>()[size_t(t) * H + h]);
      });
      const double d = (u_y + (2.0 * k + nodes) * u) * (1 + u_y) * magnitude;
      const double bound =
          d + 2 * u_out * (std::max(std::fabs(double(want)), std::fabs(double(got))) + d) + tiny;
      if (!(std::fabs(double(got) - double(want)) <= bound))
        return detail::cat("combine y[", t, ", ", h, "] = ", got, " is ", std::fabs(got - want),
                           " from the reference's ", want, ", past the node-sum bound ", bound);
    }
  }
  return "";
}

}  // namespace

// The op's view of host tensors: the tensors themselves on the CPU; on a GPU, device twins that
// `in` fills from the host and `out` copies back. The twins are made on the first call and
// reused (the n-th `in` of every call gets the n-th twin), never freed between calls: cudaFree
// waits for the whole device, where a faster peer's next call may already be spinning until
// this rank launches its own.
class OpMemory {
 public:
  explicit OpMemory(Communicator& comm) : comm_(comm), device_(comm.device()) {}
  bool on_host() const { return device_.kind == Device::Kind::cpu; }
  void next_call() { used_ = 0; }
  // `max_rows`: for a tensor of m rows, the most it can have on any call.
  Tensor in(const Tensor& host, int64_t max_rows = 0) {
    if (on_host() || host.empty()) return host;
    int64_t shape[Tensor::kMaxDims], strides[Tensor::kMaxDims], row_elements = 1;
    for (int d = host.dim() - 1; d >= 0; --d) {
      shape[d] = host.size(d);
      strides[d] = d == host.dim() - 1 ? 1 : strides[d + 1] * shape[d + 1];
      if (d > 0) row_elements *= shape[d];
    }
    if (used_ == twins_.size()) {
      const int64_t rows = std::max(host.size(0), max_rows);
      twins_.emplace_back(host.dtype(), std::initializer_list<int64_t>{rows * row_elements},
                          device_);
    }
    const Buffer& twin = twins_[used_++];
    PMOE_CHECK(host.nbytes() <= twin.nbytes(), "OpMemory: ", host.shape_str(),
               " does not fit the twin made on the first call");
    const Tensor view(twin.data<void>(), host.dtype(), host.dim(), shape, strides, device_);
    copy(view, host);
    return view;
  }
  // Waits for the op's stream, raises what its kernels reported, and copies `op` to `host`.
  void out(const Tensor& host, const Tensor& op) {
    if (on_host() || host.empty()) return;
    synchronize(comm_.stream());
    copy(host, op);
  }

 private:
  Communicator& comm_;
  Device device_;
  std::vector<Buffer> twins_;
  size_t used_ = 0;
};

CaseResult run_all_to_all_case(Communicator& comm, const AllToAllCase& c) {
  const AllToAllConfig& cfg = c.config;
  const int W = comm.size(), rank = comm.rank();
  const int E_local = cfg.num_experts / W, H = cfg.hidden_dim, S = cfg.scales_per_token();
  const int64_t rows = int64_t(W) * cfg.max_tokens;
  const bool f8 = cfg.in_dtype == DType::f8e4m3;

  PMOE_CHECK(c.device == comm.device(), "case for ", c.device.str(), " run on a communicator of ",
             comm.device().str());
  AllToAll a2a(comm, cfg);
  Buffer expert_num_tokens(DType::i32, {E_local});
  Buffer expert_x(cfg.in_dtype, {E_local, rows, H});
  Buffer expert_x_scale = f8 ? Buffer(DType::f32, {E_local, rows, S}) : Buffer();
  const Tensor expert_x_scale_arg = f8 ? expert_x_scale.tensor() : Tensor();
  OpMemory op(comm);
  // In place on a device, the expert outputs are made on the host and copied into the op's
  // buffer; on the CPU they are made in it.
  const bool made_in_place = c.in_place && op.on_host();
  Buffer own_expert_y =
      made_in_place ? Buffer()
                    : Buffer(c.in_place ? cfg.out_dtype : c.expert_y_dtype, {E_local, rows, H});
  const Tensor expert_y = made_in_place ? a2a.expert_output_buffer() : own_expert_y.tensor();
  const DType expert_y_dtype = expert_y.dtype();

  CaseResult result;
  result.digest = 0xcbf29ce484222325ull;
  float work_sink = 0;
  const int64_t M = cfg.max_tokens;
  for (int call = 0; call < c.calls; ++call) {
    op.next_call();
    const uint64_t seed = reference::hash64(c.seed, uint64_t(call));
    std::vector<AllToAllInputs> all;  // every rank's inputs, rebuilt here without communication
    for (int r = 0; r < W; ++r)
      all.push_back(reference::make_inputs(cfg, r, tokens_for(c, r, call), seed, c.routing));
    const AllToAllInputs& mine = all[size_t(rank)];
    {
      const int k = cfg.top_k, E = cfg.num_experts;
      const uint64_t token_bytes = detail::AllToAllLayout(cfg, W).payload_bytes +
                                   detail::AllToAllLayout(cfg, W).scale_bytes;
      const int32_t* indices = mine.indices.data<int32_t>();
      for (int t = 0; t < mine.m; ++t)
        for (int j = 0; j < k; ++j) {
          if (!detail::first_in_group(indices + size_t(t) * k, j, E, 1)) continue;
          const bool new_rank = detail::first_in_group(indices + size_t(t) * k, j, E, E_local);
          result.least_dispatch_bytes += token_bytes * (new_rank ? 2 : 1);
          result.least_combine_bytes += uint64_t(H) * dtype_size(expert_y_dtype);
        }
      result.least_combine_bytes += uint64_t(mine.m) * H * dtype_size(cfg.out_dtype);
    }

    std::memset(expert_x.data<void>(), kSentinel, expert_x.nbytes());
    if (f8) std::memset(expert_x_scale.data<void>(), kSentinel, expert_x_scale.nbytes());
    std::memset(expert_num_tokens.data<void>(), 0xff, expert_num_tokens.nbytes());
    Buffer y(cfg.out_dtype, {mine.m, H});
    // In place, the tokens live in the op's input buffer (free to overwrite now: this rank's
    // previous combine(recv) has returned).
    Tensor x = mine.x, x_scale = mine.x_scale_or_empty();
    if (c.in_place) {
      x = Tensor(a2a.input_buffer().data(), cfg.in_dtype, {mine.m, H}, comm.device());
      copy(x, mine.x);
      if (f8) {
        x_scale = Tensor(a2a.input_scale_buffer().data(), DType::f32, {mine.m, S}, comm.device());
        copy(x_scale, mine.x_scale);
      }
    }

    auto run_phase = [&](auto&& op) {
      if (!c.split_phases) return op(Phase::both);
      op(Phase::send);
      work_sink += busy_work(rank);
      comm.barrier();  // send must complete without any peer's recv
      op(Phase::recv);
    };
    Buffer wide_indices(DType::i64, {mine.m, cfg.top_k});
    for (int64_t i = 0; i < int64_t(mine.m) * cfg.top_k; ++i)
      wide_indices.data<int64_t>()[i] = mine.indices.data<int32_t>()[i];
    // The op's own input buffer is passed as it is, wherever it lives.
    const Tensor op_x = c.in_place ? x : op.in(x, M),
                 op_x_scale = c.in_place ? x_scale : op.in(x_scale, M),
                 op_indices = c.i64_indices ? op.in(wide_indices, M) : op.in(mine.indices, M),
                 op_counts = op.in(expert_num_tokens), op_expert_x = op.in(expert_x),
                 op_expert_x_scale = op.in(expert_x_scale_arg);
    run_phase([&](Phase phase) {
      a2a.dispatch(op_x, op_x_scale, op_indices, op_counts, op_expert_x, op_expert_x_scale, phase);
    });
    op.out(expert_num_tokens, op_counts);
    op.out(expert_x, op_expert_x);
    op.out(expert_x_scale_arg, op_expert_x_scale);
    a2a.check_errors();
    const auto expected = reference::reference_dispatch(cfg, W, rank, all);
    std::string error = reference::compare_dispatch(cfg, W, expected, expert_num_tokens, expert_x,
                                               expert_x_scale_arg, kSentinel);

    // Expert outputs may be written once dispatch(recv) has returned; NaN fills the rows that no
    // expert computes, so that reading one would show.
    std::memset(expert_y.data(), 0xff, expert_y.nbytes());
    reference::run_fake_experts(cfg, W, rank, expert_num_tokens, expert_x, expert_x_scale_arg,
                                expert_y);
    // In place on a device: into the op's own buffer, with no twin of it.
    Tensor op_expert_y;
    if (c.in_place && !made_in_place) {
      op_expert_y = a2a.expert_output_buffer();
      copy(op_expert_y, expert_y);
    } else {
      op_expert_y = op.in(expert_y);
    }
    const Tensor op_weights = op.in(mine.weights, M),
                 op_y = op.in(y, M);
    run_phase([&](Phase phase) { a2a.combine(op_expert_y, op_indices, op_weights, op_y, phase); });
    op.out(y, op_y);
    a2a.check_errors();
    if (error.empty() && cfg.combine_sums_in_node) {
      error = compare_node_summed(cfg, mine, expert_y_dtype, W, y);
    } else if (error.empty()) {
      const Buffer want = reference::reference_combine(cfg, mine, expert_y_dtype);
      error = reference::compare_bytes("combine y", y, want);
    }
    // Keep the first failure but finish every call: peers would wait for a rank that stopped.
    if (!error.empty() && result.error.empty())
      result.error = detail::cat("rank ", rank, ", call ", call, " (", describe(c), "): ", error);
    fold(result.digest, expert_num_tokens);
    fold(result.digest, expert_x);
    fold(result.digest, y);
  }
  if (work_sink < 0) result.digest ^= 1;  // keeps busy_work from being optimised away
  result.remote_bytes = a2a.remote_traffic().bytes;
  return result;
}

InputsOn inputs_on(const reference::AllToAllInputs& in, Device device) {
  InputsOn out{Buffer::like(in.x, device), Buffer::like(in.indices, device),
               Buffer::like(in.weights, device)};
  copy(out.x, in.x);
  copy(out.indices, in.indices);
  copy(out.weights, in.weights);
  return out;
}

}  // namespace pmoe::testing
