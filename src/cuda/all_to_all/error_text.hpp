// What the host says of a record AllToAll's kernels left in the error word (params.cuh): the
// pmoe::Error each code raises, naming the peer, its node and the relay where they matter.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "all_to_all/step.hpp"
#include "cuda/all_to_all/params.cuh"
#include "pmoe/error.hpp"

namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR {

using ::pmoe::detail::cat;
using ::pmoe::detail::step_name;

// The error word's mirror as the host read it.
struct ErrorRecord {
  int32_t code, detail, step, value;
  uint64_t call;
};

// In hierarchical mode a source on another node reaches this rank's dispatch(recv) through
// this node's relay for it: name that rank too, since it may be the one that is missing.
// In node-summed combine, the one rank of another node this rank waits for is its peer there,
// for either side of the relay's work (`awaited`, a TimeoutWait): say which.
inline std::string relayed_by(const AllToAllParams& p, int source, int32_t step,
                              int32_t awaited) {
  const AllToAllLayout& lay = p.layout;
  const int R = lay.ranks_per_node;
  if (lay.node_sum && step == int32_t(Step::combine_recv) && source / R != p.rank / R)
    return awaited == kAwaitedWeights
               ? cat("; this rank waited for the weights of its tokens, to sum node ",
                     p.rank / R, "'s rows of them (node-summed combine)")
               : cat("; this rank waited for node ", source / R, "'s partial sums of its "
                     "tokens, which rank ", source, " sums and sends (node-summed combine)");
  if (!lay.hierarchical || step != int32_t(Step::dispatch_recv) || source / R == p.rank / R)
    return "";
  const int relay = lay.peer_on_node(source, p.rank / R);
  if (relay == p.rank) return "";  // this rank waited for the relay block itself
  return cat("; its tokens come through rank ", relay, ", this node's relay for it");
}

// ", on node 1 (this rank is on node 0)" where the world is split into nodes of `n` ranks,
// else "".
inline std::string node_of(const AllToAllParams& p, int n, int peer) {
  if (n == p.world_size) return "";
  return cat(" (node ", peer / n, "; this rank is on node ", p.rank / n, ")");
}

// Throws the pmoe::Error for record `r` of the kernels run with `p` on `device`.
[[noreturn]] inline void raise_recorded(const ErrorRecord& r, const AllToAllParams& p,
                                       const std::string& device, int node_size) {
  const char* kernel = step_name(r.step);
  switch (r.code) {
    case kTimeout:
      throw Error(cat("AllToAll::", kernel, " on rank ", p.rank, " (", device, "): rank ",
                      r.detail, node_of(p, node_size, r.detail), " did not arrive within ",
                      p.timeout_ns / 1e9, " s", relayed_by(p, r.detail, r.step, r.value)));
    case kNoRemote:
      throw Error(cat("AllToAll::", kernel, " on rank ", p.rank, ": rank ", r.detail,
                      node_of(p, node_size, r.detail), " is on another node and this build has "
                      "no remote path to it"));
    case kTooManyTokens:
      throw Error(cat("AllToAll::", kernel, " on rank ", p.rank, ": bound_m = ",
                      r.detail, " is outside [0, ", r.value,
                      "], the rows given (the call went on with m clamped to that range)"));
    case kBadIndex:
      throw Error(cat("AllToAll::", kernel, " on rank ", p.rank, ": indices[",
                      r.detail / p.top_k, ", ", r.detail % p.top_k, "] = ",
                      r.value, " is outside [-1, ", p.num_local_experts * p.world_size,
                      ") or repeats an expert of its row (the slot was skipped)",
                      r.value == INT32_MIN ? "; an int64 index outside int32 reads as this" : ""));
    case kStepOrder:
      throw Error(cat("AllToAll::", kernel, " on rank ", p.rank, " (", device,
                      "): the device ran ", kernel, " where it expected ", step_name(r.detail),
                      ": steps out of order, as when a CUDA graph of dispatch or combine is "
                      "replayed twice in a row (each dispatch must be followed by one combine); "
                      "the step did nothing, and this AllToAll is unusable: create a new one"));
    case kTokensMismatch:
      throw Error(cat("AllToAll::", kernel, " on rank ", p.rank, ": combine's m = ",
                      r.detail, " differs from the m = ", r.value, " of the dispatch it follows "
                      "(bound_m, or the rows given); only the first ", std::min(r.detail, r.value),
                      " rows of y were combined"));
    case kDtypeMismatch:
      throw Error(cat("AllToAll::", kernel, " on rank ", p.rank, ": rank ", r.detail,
                      " sent expert_y as ", dtype_name(DType(r.value)), " but this rank's is ",
                      dtype_name(DType(p.y_dtype)),
                      "; every rank must pass the same expert_y dtype"));
    case kAborted:
      throw Error(cat("AllToAll::", kernel, " on rank ", p.rank, " (", device, "): its wait "
                      "for rank ", r.detail, " ended as a peer was found lost"));
    default:
      throw Error(cat("AllToAll on rank ", p.rank, ": device error code ", r.code));
  }
}

}  // namespace pmoe::cuda::inline PMOE_CUDA_FLAVOR
