#include "comm/group.hpp"

#include "pmoe/error.hpp"

namespace pmoe::detail {

void Group::check(int rank) const {
  if (!failed()) return;
  std::lock_guard lock(mutex_);
  throw Error(cat("rank ", rank, ": stopped waiting because rank ", failed_rank_,
                  " failed: ", failure_));
}

void Group::fail(int rank, const std::string& message) {
  std::lock_guard lock(mutex_);
  if (failed_rank_ >= 0) return;
  failed_rank_ = rank;
  failure_ = message;
  failed_.store(true, std::memory_order_release);
}

}  // namespace pmoe::detail
