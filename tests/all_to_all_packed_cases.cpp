#include "all_to_all_packed_cases.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "all_to_all_cases.hpp"
#include "pmoe/error.hpp"
#include "reference/all_to_all_reference.hpp"

namespace pmoe::testing {
namespace {

using reference::Routing;

// The expected rows of every local expert, back to back.
std::vector<std::byte> packed_expected(const reference::DispatchExpected& expected) {
  std::vector<std::byte> all;
  for (const auto& rows : expected.rows) all.insert(all.end(), rows.begin(), rows.end());
  return all;
}

// One rank's round with exactly sized rows; returns what differs from the reference, or "".
// too_small: first offer dispatch(recv) one row too few, and combine one too few (both
// refused, by name), then the right sizes.
std::string exact_round(Communicator& comm, AllToAll& a2a, const AllToAllConfig& cfg, int call,
                        bool too_small) {
  const int W = comm.size(), rank = comm.rank(), H = cfg.hidden_dim;
  const int E_local = cfg.num_experts / W;
  std::vector<reference::AllToAllInputs> all;
  for (int r = 0; r < W; ++r)
    all.push_back(reference::make_inputs(cfg, r,
                                         (call + r) % 4 == 3 ? 0
                                                             : std::max(0, cfg.max_tokens - r % 3),
                                         reference::hash64(call, 3), Routing::dropped));
  const auto& mine = all[size_t(rank)];
  Buffer counts(DType::i32, {E_local});
  Buffer none(cfg.in_dtype, {0, H});  // dispatch(send) writes no row
  a2a.dispatch(mine.x, Tensor(), mine.indices, counts, none, Tensor(), Phase::send);
  const int64_t n = a2a.arriving_rows();
  const auto expected = reference::reference_dispatch(cfg, W, rank, all);
  int64_t want_n = 0;
  for (int32_t c : expected.counts) want_n += c;
  if (n != want_n) return detail::cat("arriving_rows() = ", n, ", expected ", want_n);

  if (too_small && n > 0) {
    Buffer short_rows(cfg.in_dtype, {n - 1, H});
    const std::string error = error_of([&] {
      a2a.dispatch(mine.x, Tensor(), mine.indices, counts, short_rows, Tensor(), Phase::recv);
    });
    if (error.find("packed `expert_x` has " + std::to_string(n - 1) + " rows, fewer than the "
                   "rows arriving this call") == std::string::npos)
      return "short expert_x: " + error;
  }
  Buffer rows(cfg.in_dtype, {n, H});
  a2a.dispatch(mine.x, Tensor(), mine.indices, counts, rows, Tensor(), Phase::recv);
  if (std::memcmp(counts.data<int32_t>(), expected.counts.data(), expected.counts.size() * 4) != 0)
    return "expert_num_tokens differs from the reference";
  const std::vector<std::byte> want = packed_expected(expected);
  if (size_t(rows.nbytes()) != want.size() ||
      (!want.empty() && std::memcmp(rows.data<void>(), want.data(), want.size()) != 0))
    return "packed rows differ from the reference";

  Buffer expert_y(DType::f32, {n, H});
  reference::run_fake_experts(cfg, W, rank, counts, rows, Tensor(), expert_y);
  Buffer y(cfg.out_dtype, {mine.m, H});
  if (too_small && n > 0) {
    Buffer short_y(DType::f32, {n - 1, H});
    const std::string error =
        error_of([&] { a2a.combine(short_y, mine.indices, mine.weights, y); });
    if (error.find("fewer than the rows the matching dispatch received") == std::string::npos)
      return "short expert_y: " + error;
  }
  a2a.combine(expert_y, mine.indices, mine.weights, y);
  return reference::compare_bytes("combine y", y, reference::reference_combine(cfg, mine,
                                                                                DType::f32));
}

}  // namespace

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string run_exact_packed_rounds(Communicator& comm, const AllToAllConfig& cfg, int calls,
                                    bool too_small) {
  AllToAll a2a(comm, cfg);
  std::string error;
  for (int call = 0; call < calls && error.empty(); ++call)
    error = exact_round(comm, a2a, cfg, call, too_small);
  return error;
}

}  // namespace pmoe::testing
