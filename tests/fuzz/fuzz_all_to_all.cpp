// Fuzz target: AllToAll on 1..4 thread ranks. One config shared by every rank (random, often
// invalid), then 1..3 calls whose m, routing, expert output dtype, phases, bound_m and input
// corruptions (an index out of range, a repeated expert, m over the bound) and argument defects
// (wrong dtype, shape, strides, device, a missing or extra scale tensor, a phase out of order) are
// drawn from the input. The oracle:
//   - a config this file judges invalid must throw pmoe::Error on every rank, a valid one never;
//   - a call with valid inputs must match the plain reference on every rank;
//   - the first call with a bad input or argument must throw pmoe::Error on every rank;
//   - never another exception, a crash, a sanitizer report, or a wait that times out.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "fuzz_input.hpp"
#include "pmoe/all_to_all.hpp"
#include "pmoe/error.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::fuzz {
namespace {

using reference::AllToAllInputs;

enum class Corruption : uint8_t { none, drop_slot, out_of_range, below_minus_one, repeat, m_over };
enum class Defect : uint8_t {
  none, x_dtype, x_strides, indices_shape, expert_x_rows, scale_flip, weights_dtype, y_rows,
  combine_first, x_device, bound_m_over, bound_m_exact, count
};

struct CallPlan {
  std::vector<int> m;  // per rank
  reference::Routing routing = reference::Routing::random;
  uint64_t seed = 0;
  Corruption corruption = Corruption::none;
  int bad_rank = 0, bad_row = 0, bad_slot = 0;
  Defect defect = Defect::none;
  DType expert_y = DType::f32;
  bool split = false;
};

struct Plan {
  int W = 1;
  AllToAllConfig cfg;
  std::vector<CallPlan> calls;
};

bool config_valid(const AllToAllConfig& c, int W) {
  const bool f8 = c.in_dtype == DType::f8e4m3;
  return c.max_tokens >= 1 && c.num_experts >= 1 && c.num_experts % W == 0 &&
         c.top_k >= 1 && c.top_k <= c.num_experts && c.hidden_dim >= 1 &&
         (c.in_dtype == DType::f32 || c.in_dtype == DType::bf16 || c.in_dtype == DType::f16 ||
          f8) &&
         (c.out_dtype == DType::f32 || c.out_dtype == DType::bf16 || c.out_dtype == DType::f16) &&
         (f8 ? c.scale_block >= 1 && c.hidden_dim % c.scale_block == 0 : c.scale_block == 0);
}

Plan make_plan(FuzzInput& in) {
  Plan p;
  p.W = in.range(1, 4);
  AllToAllConfig& c = p.cfg;
  const DType all_dtypes[] = {DType::f32, DType::bf16, DType::f16, DType::f8e4m3, DType::i32};
  c.max_tokens = in.chance(16) ? in.range(-2, 0) : in.range(1, 9);
  c.num_experts = in.chance(16) ? in.range(-1, 0) : p.W * in.range(1, 3) + (in.chance(16) ? 1 : 0);
  c.top_k = in.chance(16) ? in.range(-1, c.num_experts + 2)
                                      : in.range(1, std::max(1, c.num_experts));
  c.in_dtype = all_dtypes[in.chance(16) ? 4 : in.range(0, 3)];
  c.out_dtype = all_dtypes[in.chance(16) ? in.range(3, 4) : in.range(0, 2)];
  if (c.in_dtype == DType::f8e4m3) {
    c.scale_block = in.chance(16) ? in.range(-1, 0) : in.pick({1, 2, 4, 8, 16, 3});
    c.hidden_dim = std::max(1, c.scale_block) * in.range(1, 8) + (in.chance(16) ? 1 : 0);
  } else {
    c.scale_block = in.chance(8) ? in.range(1, 8) : 0;
    c.hidden_dim = in.chance(8) ? in.range(-1, 0) : in.range(1, 40);
  }
  c.in_place_buffers = in.chance(64);
  c.packed_expert_rows = in.chance(64);  // the reference reads either layout
  const int calls = in.range(1, 3);
  for (int i = 0; i < calls; ++i) {
    CallPlan call;
    for (int r = 0; r < p.W; ++r) call.m.push_back(in.range(0, std::max(0, c.max_tokens)));
    call.routing = static_cast<reference::Routing>(in.range(0, 2));
    call.seed = in.u64();
    call.corruption = in.chance(40) ? static_cast<Corruption>(in.range(1, 5)) : Corruption::none;
    call.bad_rank = in.range(0, p.W - 1);
    call.bad_row = in.range(0, 255);
    call.bad_slot = in.range(0, 255);
    call.defect = in.chance(40) ? static_cast<Defect>(in.range(1, int(Defect::count) - 1))
                                : Defect::none;
    call.expert_y = in.pick({DType::f32, DType::bf16, DType::f16});
    call.split = in.chance(128);
    p.calls.push_back(call);
  }
  return p;
}

// Applies the call's corruption to every rank's copy of the inputs (each rank rebuilds them all);
// returns false if the corruption makes the call invalid.
bool corrupt(const Plan& p, const CallPlan& call, std::vector<AllToAllInputs>& all) {
  AllToAllInputs& victim = all[size_t(call.bad_rank)];
  const int k = p.cfg.top_k, E = p.cfg.num_experts;
  if (call.corruption == Corruption::m_over) return false;  // applied when m is chosen
  if (call.corruption == Corruption::none || victim.m == 0) return true;
  int32_t* idx = victim.indices.data<int32_t>();
  const int row = call.bad_row % victim.m, slot = call.bad_slot % k;
  int32_t* at = idx + size_t(row) * size_t(k);
  switch (call.corruption) {
    case Corruption::drop_slot: at[slot] = -1; return true;
    case Corruption::out_of_range: at[slot] = E + call.bad_slot % 3; return false;
    case Corruption::below_minus_one: at[slot] = -2 - call.bad_slot % 3; return false;
    case Corruption::repeat: {
      if (k < 2) return true;
      const int other = (slot + 1) % k;
      if (at[other] == -1) at[other] = at[slot] == -1 ? 0 : at[slot];
      at[slot] = at[other];
      return false;
    }
    default: return true;
  }
}

// A defect needs the shapes it breaks to exist (a stride only matters with two rows and two
// columns; scales only exist for f8); otherwise the call stays valid.
bool defect_applies(const Plan& p, const CallPlan& call, int m) {
  switch (call.defect) {
    case Defect::none: case Defect::bound_m_exact: return false;
    case Defect::x_strides: return m >= 2 && p.cfg.hidden_dim >= 2;
    default: return true;
  }
}

constexpr uint8_t kSentinel = 0xC3;

struct RankState {
  std::string mismatch;  // the first output that differed from the reference
};

void run_rank(Communicator& comm, const Plan& p, int& calls_done, RankState& state) {
  const AllToAllConfig& cfg = p.cfg;
  const int W = comm.size(), rank = comm.rank();
  AllToAll a2a(comm, cfg);
  const int E_local = cfg.num_experts / W, H = cfg.hidden_dim, S = cfg.scales_per_token();
  const int64_t rows = int64_t(W) * cfg.max_tokens;
  const bool f8 = cfg.in_dtype == DType::f8e4m3;
  Buffer counts(DType::i32, {E_local});
  Buffer expert_x(cfg.in_dtype, {E_local, rows, H});
  Buffer expert_x_scale = f8 ? Buffer(DType::f32, {E_local, rows, S}) : Buffer();
  const Tensor scale_out = f8 ? expert_x_scale.tensor() : Tensor();
  for (size_t i = 0; i < p.calls.size(); ++i) {
    const CallPlan& call = p.calls[i];
    std::vector<AllToAllInputs> all;
    for (int r = 0; r < W; ++r) {
      int m = call.m[size_t(r)];
      if (call.corruption == Corruption::m_over && r == call.bad_rank) m = cfg.max_tokens;
      all.push_back(reference::make_inputs(cfg, r, m, call.seed, call.routing));
    }
    corrupt(p, call, all);
    AllToAllInputs& mine = all[size_t(rank)];
    Tensor x = mine.x, x_scale = mine.x_scale_or_empty(), indices = mine.indices;
    Tensor weights = mine.weights;
    Buffer y(cfg.out_dtype, {mine.m, H});
    Tensor y_arg = y, expert_x_arg = expert_x;
    Buffer big_x, bound, wrong_weights, wrong_indices, wrong_y, extra_scale;
    const bool my_defect = rank == call.bad_rank && defect_applies(p, call, mine.m);
    if (call.corruption == Corruption::m_over && rank == call.bad_rank) {
      // One row more than the bound: x is built for max rows, then viewed with one more.
      big_x = Buffer(cfg.in_dtype, {mine.m + 1, H});
      x = big_x;
      indices = Buffer(DType::i32, {mine.m + 1, cfg.top_k});
      if (f8) x_scale = Buffer(DType::f32, {mine.m + 1, S});
    }
    if (rank == call.bad_rank && (call.defect == Defect::bound_m_over ||
                                  call.defect == Defect::bound_m_exact)) {
      bound = Buffer(DType::i32, {1});
      *bound.data<int32_t>() = int32_t(x.size(0)) + (call.defect == Defect::bound_m_over ? 1 : 0);
    }
    if (my_defect) {
      switch (call.defect) {
        case Defect::x_dtype: {
          const DType wrong = cfg.in_dtype == DType::f32 ? DType::bf16 : DType::f32;
          big_x = Buffer(DType::f32, {x.size(0), H});  // enough bytes for either dtype
          x = Tensor(big_x.data<void>(), wrong, {x.size(0), H});
          break;
        }
        case Defect::x_strides: {
          const int64_t shape[2] = {x.size(0), x.size(1)}, strides[2] = {1, x.size(0)};
          x = Tensor(x.data(), x.dtype(), 2, shape, strides);
          break;
        }
        case Defect::indices_shape:
          wrong_indices = Buffer(DType::i32, {x.size(0), cfg.top_k + 1});
          indices = wrong_indices;
          break;
        case Defect::expert_x_rows:
          expert_x_arg = Tensor(expert_x.data<void>(), cfg.in_dtype, {E_local, rows - 1, H});
          break;
        case Defect::scale_flip:
          if (f8) {
            x_scale = Tensor();
          } else {
            extra_scale = Buffer(DType::f32, {x.size(0), 1});
            x_scale = extra_scale;
          }
          break;
        case Defect::weights_dtype:
          wrong_weights = Buffer(DType::bf16, {x.size(0), cfg.top_k});
          weights = wrong_weights;
          break;
        case Defect::y_rows:
          wrong_y = Buffer(cfg.out_dtype, {x.size(0) + 1, H});
          y_arg = wrong_y;
          break;
        case Defect::x_device:
          x = Tensor(x.data(), x.dtype(), {x.size(0), x.size(1)}, Device::cuda(0));
          break;
        default: break;
      }
    }
    const Tensor bound_m = bound.tensor();
    std::memset(expert_x.data<void>(), kSentinel, expert_x.nbytes());
    if (f8) std::memset(expert_x_scale.data<void>(), kSentinel, expert_x_scale.nbytes());
    Buffer expert_y(call.expert_y, {E_local, rows, H});
    if (my_defect && call.defect == Defect::combine_first)
      a2a.combine(expert_y, indices, weights, y_arg, Phase::both, bound_m);
    auto phases = [&](auto&& fn) {
      if (!call.split) return fn(Phase::both);
      fn(Phase::send);
      fn(Phase::recv);
    };
    phases([&](Phase ph) {
      a2a.dispatch(x, x_scale, indices, counts, expert_x_arg, scale_out, ph, bound_m);
    });
    const auto expected = reference::reference_dispatch(cfg, W, rank, all);
    std::string error = reference::compare_dispatch(cfg, W, expected, counts, expert_x,
                                                    scale_out, kSentinel);
    reference::run_fake_experts(cfg, W, rank, counts, expert_x, scale_out, expert_y);
    phases([&](Phase ph) { a2a.combine(expert_y, indices, weights, y_arg, ph, bound_m); });
    if (error.empty())
      error = reference::compare_bytes("combine y", y,
                                       reference::reference_combine(cfg, mine, call.expert_y));
    if (!error.empty() && state.mismatch.empty())
      state.mismatch = "call " + std::to_string(i) + ": " + error;
    if (rank == 0) calls_done = int(i) + 1;
  }
}

}  // namespace
}  // namespace pmoe::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  pmoe::fuzz::init_fuzzing();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pmoe::fuzz;
  FuzzInput in(data, size);
  const Plan p = make_plan(in);
  const bool valid_config = config_valid(p.cfg, p.W);
  // The first call that must be rejected, and how many calls before it must succeed.
  size_t first_bad = p.calls.size();
  if (valid_config) {
    for (size_t i = 0; i < p.calls.size() && first_bad == p.calls.size(); ++i) {
      const CallPlan& call = p.calls[i];
      bool bad = call.corruption == Corruption::m_over;
      if (!bad) {
        std::vector<pmoe::reference::AllToAllInputs> all;
        for (int r = 0; r < p.W; ++r)
          all.push_back(pmoe::reference::make_inputs(p.cfg, r, call.m[size_t(r)], call.seed,
                                                     call.routing));
        bad = !corrupt(p, call, all);
      }
      bad = bad || defect_applies(p, call, call.m[size_t(call.bad_rank)]) ||
            call.defect == Defect::bound_m_over;
      if (bad) first_bad = i;
    }
  }
  int calls_done = 0;
  std::vector<RankState> states(static_cast<size_t>(p.W));
  const auto outcomes = run_collective(p.W, [&](pmoe::Communicator& comm) {
    run_rank(comm, p, calls_done, states[size_t(comm.rank())]);
  });
  const bool threw = all_threw(outcomes, "AllToAll");
  for (int r = 0; r < p.W; ++r)
    if (!states[size_t(r)].mismatch.empty())
      fuzz_bug("rank " + std::to_string(r) + " differs from the reference: " +
               states[size_t(r)].mismatch);
  if (!valid_config && !threw) fuzz_bug("an invalid AllToAllConfig was accepted");
  if (valid_config && first_bad == p.calls.size() && threw)
    fuzz_bug("a valid run threw: " + outcomes[0].message);
  if (valid_config && first_bad < p.calls.size() && !threw)
    fuzz_bug("call " + std::to_string(first_bad) + " with a bad input or argument was accepted");
  count_outcome(threw);
  return 0;
}
