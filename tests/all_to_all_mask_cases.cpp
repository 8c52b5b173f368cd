#include "all_to_all_mask_cases.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "pmoe/error.hpp"
#include "pmoe/graph.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {

MaskCase lost_rank_case(MaskCase c, double peer_timeout_s, int calls) {
  c.config.rank_mask = false;
  c.config.on_peer_loss = OnPeerLoss::mask;
  c.config.peer_timeout_s = peer_timeout_s;
  c.automatic = true;
  c.calls = calls;
  return c;
}
namespace {

// The test's own view of the routing: each logical expert's slots, and which ranks live.
struct Routing {
  std::vector<int32_t> slot_expert;  // slot -> logical expert
  int logical = 0, slots_per_rank = 1;
  std::vector<uint8_t> live;

  std::vector<int> live_slots(int e) const {
    std::vector<int> out;
    for (size_t s = 0; s < slot_expert.size(); ++s)
      if (slot_expert[s] == e && live[s / size_t(slots_per_rank)]) out.push_back(int(s));
    return out;
  }
  // The slot token t of rank r reaches for expert e; -1 if none is live.
  int slot_of(int e, int r, int t) const {
    const std::vector<int> slots = live_slots(e);
    return slots.empty() ? -1 : slots[size_t((r + t) % int(slots.size()))];
  }
};

// A case's config with its logical experts as the experts, for make_inputs.
AllToAllConfig logical_config(const AllToAllConfig& c) {
  AllToAllConfig g = c;
  if (!c.placement.empty()) g.num_experts = c.placement.num_logical_experts;
  return g;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// When each rank stopped (automatic mode), for the survivors' detection times: thread ranks
// share the process.
std::atomic<int64_t> stopped_at_ns[64];

// The call (numbered from 1) the survivors lose when a rank stops at call index `at`.
int64_t lost_call(const MaskCase& c, int at) {
  return at + 1 + (c.stop_point == MaskCase::StopPoint::after_combine_send ? 1 : 0);
}

int tokens_for(const MaskCase& c, int rank, int call) {
  return int(reference::hash64(c.seed, 0x3a5c, uint64_t(rank), uint64_t(call)) %
             uint64_t(c.config.max_tokens + 1));
}

}  // namespace

std::string run_mask_case(Communicator& comm, const MaskCase& c,
                          std::vector<LossReport>* losses) {
  const AllToAllConfig& cfg = c.config;
  const int W = comm.size(), rank = comm.rank(), k = cfg.top_k;
  const int L = cfg.num_experts / W, H = cfg.hidden_dim;
  const int64_t rows = int64_t(W) * cfg.max_tokens;
  const AllToAllConfig inputs_cfg = logical_config(cfg);
  Routing routing;
  routing.slots_per_rank = L;
  routing.live.assign(size_t(W), 1);
  routing.logical = inputs_cfg.num_experts;
  if (cfg.placement.empty())
    for (int s = 0; s < cfg.num_experts; ++s) routing.slot_expert.push_back(s);
  else
    routing.slot_expert = cfg.placement.slot_expert;

  AllToAll a2a(comm, cfg);
  const Device device = comm.device();
  const bool host = device.kind == Device::Kind::cpu;
  Buffer counts(DType::i32, {L}), expert_x(cfg.in_dtype, {L, rows, H}),
      expert_y(cfg.out_dtype, {L, rows, H});
  Buffer d_counts(DType::i32, {L}, device), d_expert_x(cfg.in_dtype, {L, rows, H}, device),
      d_expert_y(cfg.out_dtype, {L, rows, H}, device);
  // Made once at the most tokens and viewed at m rows: freeing device memory between calls would
  // wait for the whole device, where a peer's next call may spin until this rank launches.
  const int M = cfg.max_tokens;
  Buffer d_x_all(cfg.in_dtype, {M, H}, device), d_indices_all(DType::i32, {M, k}, device),
      d_weights_all(DType::f32, {M, k}, device), d_y_all(cfg.out_dtype, {M, H}, device);
  Buffer bound_m(DType::i32, {1}, device);
  std::optional<CudaGraph> dispatch_graph, combine_graph;
  if (c.graph) {
    const Tensor x(d_x_all), indices(d_indices_all), weights(d_weights_all), y(d_y_all);
    dispatch_graph.emplace(comm.stream(), [&] {
      a2a.dispatch(x, Tensor(), indices, d_counts, d_expert_x, Tensor(), Phase::both, bound_m);
    });
    combine_graph.emplace(comm.stream(), [&] {
      a2a.combine(d_expert_y, indices, weights, y, Phase::both, bound_m);
    });
  }
  const size_t row_bytes = size_t(H) * dtype_size(cfg.in_dtype);
  const size_t out_row_bytes = size_t(H) * dtype_size(cfg.out_dtype);

  // The first failure is kept, but every call is made: peers would wait for a rank that stopped.
  std::string first_error;
  auto fail = [&](int call, const std::string& what) {
    if (first_error.empty()) first_error = detail::cat("rank ", rank, ", call ", call, ": ", what);
  };
  // Waits for the stream and notes what the kernels reported.
  auto finish = [&](int call) {
    if (!host) synchronize(comm.stream());
    try {
      a2a.check_errors();
    } catch (const PeerLost&) {
      throw;  // on a device, a loss the kernels met: the call's own handler takes it
    } catch (const Error& e) {
      fail(call, e.what());
    }
  };
  using StopPoint = MaskCase::StopPoint;
  // This rank stops calling. Its thread keeps the op and buffers until every rank is done, as a
  // dead process frees nothing: freeing device memory here would wait for the whole device,
  // where the others' kernels run.
  auto rejoins_at = [&](int r) {
    for (const auto& [joining, at] : c.rejoins)
      if (joining == r) return at;
    return -1;
  };
  // Stops, and, where this rank rejoins, comes back: true once it has.
  auto stop_or_rejoin = [&](int call) {
    stopped_at_ns[rank].store(now_ns());
    if (c.stopped_rank_returns) {
      const double timeout = cfg.peer_timeout_s;
      std::this_thread::sleep_for(std::chrono::duration<double>(3 * timeout));
      try {
        a2a.dispatch(Tensor(d_x_all.data<void>(), cfg.in_dtype, {0, H}, device), Tensor(),
                     Tensor(d_indices_all.data<void>(), DType::i32, {0, k}, device), d_counts,
                     d_expert_x, Tensor());
        fail(call, "the call of a rank the others went on without returned");
      } catch (const PeerLost& e) {
        fail(call, detail::cat("a PeerLost where an Error was due: ", e.what()));
      } catch (const Error& e) {
        if (std::string(e.what()).find("went on without this one") == std::string::npos)
          fail(call, detail::cat("the returning rank's error does not say why: ", e.what()));
      }
    }
    if (rejoins_at(rank) >= 0) {
      a2a.rejoin();
      if (a2a.calls_started() != rejoins_at(rank))
        fail(call, detail::cat("rejoined with ", a2a.calls_started(), " calls where the others "
                               "had made ", rejoins_at(rank)));
      return true;
    }
    comm.barrier();
    return false;
  };
  auto stop = [&](int call) {
    stop_or_rejoin(call);
    return first_error;
  };
  auto stops_here = [&](int call, StopPoint point) {
    if (c.stop_point != point) return false;
    for (const auto& [stopped, at] : c.stops)
      if (stopped == rank && at == call) return true;
    return false;
  };

  if (c.on_ready) c.on_ready();
  int last_call = c.calls;  // random_losses: moved on by each loss
  for (int call = 0; call < last_call;) {
    if (c.automatic) {
      for (const auto& [joining, at] : c.rejoins)
        if (at == call && joining != rank && !routing.live[size_t(joining)]) {
          a2a.unmask_rank(joining);
          routing.live[size_t(joining)] = 1;
        }
      if (stops_here(call, StopPoint::before_call)) {
        if (!stop_or_rejoin(call)) return first_error;
        routing.live = a2a.rank_mask().live;
        call = int(a2a.calls_started());
        continue;
      }
    } else {
      for (const auto& [stopped, at] : c.stops) {
        if (at != call) continue;
        if (stopped == rank) return stop(call);
        if (routing.live[size_t(stopped)]) {
          a2a.mask_rank(stopped, "stopped calling in the test");
          routing.live[size_t(stopped)] = 0;
        }
      }
    }
    const uint64_t seed = reference::hash64(c.seed, uint64_t(call));
    std::vector<reference::AllToAllInputs> all;
    for (int r = 0; r < W; ++r)
      all.push_back(reference::make_inputs(inputs_cfg, r, tokens_for(c, r, call), seed,
                                           reference::Routing::random));
    const reference::AllToAllInputs& mine = all[size_t(rank)];
    const int m = mine.m;

    auto run_phase = [&](auto&& op) {
      if (!c.split_phases) return op(Phase::both);
      op(Phase::send);
      op(Phase::recv);
    };
    const Tensor d_x(d_x_all.data<void>(), cfg.in_dtype, {m, H}, device),
        d_indices(d_indices_all.data<void>(), DType::i32, {m, k}, device),
        d_weights(d_weights_all.data<void>(), DType::f32, {m, k}, device),
        d_y(d_y_all.data<void>(), cfg.out_dtype, {m, H}, device);
    Buffer y(cfg.out_dtype, {m, H});
    copy(d_x, mine.x);
    copy(d_indices, mine.indices);
    copy(d_weights, mine.weights);
    try {
      if (c.graph) {
        int32_t m32 = m;
        copy(bound_m, Tensor(&m32, DType::i32, {1}));
        dispatch_graph->replay();
      } else if (stops_here(call, StopPoint::after_dispatch_send)) {
        a2a.dispatch(d_x, Tensor(), d_indices, d_counts, d_expert_x, Tensor(), Phase::send);
        return stop(call);
      } else {
        run_phase([&](Phase phase) {
          a2a.dispatch(d_x, Tensor(), d_indices, d_counts, d_expert_x, Tensor(), phase);
        });
      }
      finish(call);
      copy(counts, d_counts);
      copy(expert_x, d_expert_x);

      // The rows each local slot must have received, counted from every live rank's tokens.
      std::vector<int32_t> want(size_t(L), 0);
      for (int r = 0; r < W; ++r) {
        if (!routing.live[size_t(r)]) continue;
        const int32_t* idx = all[size_t(r)].indices.data<int32_t>();
        for (int t = 0; t < all[size_t(r)].m; ++t)
          for (int j = 0; j < k; ++j) {
            const int32_t e = idx[t * k + j];
            const int slot = e < 0 ? -1 : routing.slot_of(e, r, t);
            if (slot >= 0 && slot / L == rank) ++want[size_t(slot % L)];
          }
      }
      for (int l = 0; l < L; ++l)
        if (counts.data<int32_t>()[l] != want[size_t(l)])
          fail(call, detail::cat("slot ", rank * L + l, " received ", counts.data<int32_t>()[l],
                                 " rows, the reference ", want[size_t(l)]));

      // Each slot computes its logical expert's stand-in function.
      for (int l = 0; l < L; ++l)
        for (int i = 0; i < std::min<int>(counts.data<int32_t>()[l], int(rows)); ++i) {
          const size_t row = size_t(l) * size_t(rows) + size_t(i);
          reference::fake_expert_row(cfg, expert_x.data<std::byte>() + row * row_bytes, nullptr,
                                     routing.slot_expert[size_t(rank * L + l)], cfg.out_dtype,
                                     expert_y.data<std::byte>() + row * out_row_bytes);
        }
      copy(d_expert_y, expert_y);
      if (c.graph) {
        combine_graph->replay();
      } else if (stops_here(call, StopPoint::after_combine_send)) {
        a2a.combine(d_expert_y, d_indices, d_weights, d_y, Phase::send);
        return stop(call);
      } else {
        run_phase([&](Phase phase) { a2a.combine(d_expert_y, d_indices, d_weights, d_y, phase); });
      }
      finish(call);
    } catch (const PeerLost& e) {
      if (!c.automatic && !c.random_losses) throw;
      const int64_t noticed = now_ns();
      if (c.random_losses) {
        if (losses)
          losses->push_back({e.ranks(), e.first_call(), e.last_call(), a2a.calls_started() + 1,
                             noticed, e.what()});
        // No call lost (first = last + 1) where check_errors() on a device found the loss after
        // this rank's calls had all finished.
        if (e.ranks().empty() || e.first_call() > e.last_call() + 1 ||
            e.last_call() - e.first_call() > 1 ||
            (e.first_call() > e.last_call() && host))
          fail(call, detail::cat("a PeerLost naming no rank or more than two calls: ", e.what()));
        routing.live = a2a.rank_mask().live;
        call = int(a2a.calls_started());
        last_call = call + c.calls_after_loss;
        continue;
      }
      // Every stop whose lost call this is must be named, and only those.
      std::vector<int> due;
      for (const auto& [stopped, at] : c.stops)
        if (lost_call(c, at) == e.first_call()) due.push_back(stopped);
      std::sort(due.begin(), due.end());
      if (e.ranks() != due || e.last_call() != e.first_call())
        fail(call, detail::cat("a PeerLost for calls ", e.first_call(), "..", e.last_call(),
                               " naming ", e.ranks().size(), " rank(s) where ", due.size(),
                               " stopped before that call: ", e.what()));
      for (int r : e.ranks()) {
        const double ms = double(noticed - stopped_at_ns[r].load()) / 1e6;
        if (ms > 1000 * cfg.peer_timeout_s + 1000)
          fail(call, detail::cat("rank ", r, " was found lost ", ms, " ms after it stopped"));
      }
      routing.live = a2a.rank_mask().live;
      call = int(a2a.calls_started());
      continue;
    }
    copy(y, d_y);

    // The reference: experts with no live slot dropped, and with renormalize the weights kept
    // divided by their sum (f32, slot order) in a token that lost one.
    reference::AllToAllInputs expected =
        reference::make_inputs(inputs_cfg, rank, m, seed, reference::Routing::random);
    int32_t* idx = expected.indices.data<int32_t>();
    float* w = expected.weights.data<float>();
    for (int t = 0; t < m; ++t) {
      float kept = 0.0f;
      bool lost = false;
      for (int j = 0; j < k; ++j) {
        if (idx[t * k + j] >= 0 && routing.live_slots(idx[t * k + j]).empty()) {
          idx[t * k + j] = -1;
          lost = true;
        }
        if (idx[t * k + j] >= 0) kept += w[t * k + j];
      }
      if (cfg.masked_experts == MaskedExperts::renormalize && lost && kept > 0.0f)
        for (int j = 0; j < k; ++j) w[t * k + j] /= kept;
    }
    const Buffer want_y = reference::reference_combine(cfg, expected, cfg.out_dtype);
    const std::string error = reference::compare_bytes("combine y", y, want_y);
    if (!error.empty()) fail(call, error);
    ++call;
  }
  if (c.random_losses) return first_error;
  comm.barrier();  // with the ranks that stopped
  return first_error;
}

void expect_mask_case(int W, const MaskCase& c, Device device) {
  std::vector<std::string> errors(static_cast<size_t>(W));
  run_ranks(W, [&](Communicator& comm) { errors[size_t(comm.rank())] = run_mask_case(comm, c); },
            device);
  for (int r = 0; r < W; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

}  // namespace pmoe::testing
