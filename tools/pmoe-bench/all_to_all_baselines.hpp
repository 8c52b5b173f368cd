// The two ways to move MoE tokens that pmoe-bench compares AllToAll with, over the same inputs,
// the same stand-in experts and the same reference check:
//
//   alltoallv:    what a careful user writes without pmoe (Megatron's token dispatcher): sort
//                 the (token, expert) rows by expert, exchange the counts, MPI_Alltoallv the rows,
//                 regroup them per local expert; back: pack, MPI_Alltoallv, un-permute and sum.
//   dense_padded: pplx-kernels' "AtA" rows: every rank sends a dense [W, E_local, max_tokens, H]
//                 block whatever the routing, and gets the same back.
//
// Between threads the MPI calls become plain copies (ByteAllToAllV).
#pragma once

#include <memory>
#include <string>

#include "pmoe/all_to_all.hpp"
#include "reference/workload.hpp"

namespace pmoe::bench {

class BaselinePath {
 public:
  virtual ~BaselinePath() = default;
  virtual void dispatch() = 0;     // timed: tokens to per-expert rows at their owners
  virtual void run_experts() = 0;  // untimed: the stand-in experts of reference/
  virtual void combine() = 0;      // timed: expert rows back, weighted sum into y
  // After dispatch, run_experts, combine: "" if y (and the received rows, where the layout
  // allows) match the reference, else the first difference.
  virtual std::string check(const std::vector<reference::AllToAllInputs>& all) = 0;
};

std::unique_ptr<BaselinePath> make_alltoallv_path(Communicator& comm, const AllToAllConfig& config,
                                                  const reference::AllToAllInputs& inputs);
std::unique_ptr<BaselinePath> make_dense_padded_path(Communicator& comm,
                                                     const AllToAllConfig& config,
                                                     const reference::AllToAllInputs& inputs);

}  // namespace pmoe::bench
