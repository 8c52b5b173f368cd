#include "comm/group.hpp"

#include "comm/peer_watch.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {

Group::~Group() = default;

void Group::check(int rank) {
  check_failed(rank);
  // Not recorded as the group's failure: an op that masks lost peers goes on without them.
  if (!watch_) return;
  const std::string why = watch_->poll();
  if (!why.empty()) throw Error(cat("rank ", rank, ": stopped waiting because ", why));
}

void Group::check_failed(int rank) {
  if (!failed()) return;
  std::lock_guard lock(mutex_);
  throw Error(cat("rank ", rank, ": stopped waiting because rank ", failed_rank_,
                  " failed: ", failure_));
}

bool Group::peer_ended(int r) { return watch_ && watch_->ended(r); }

void Group::note_rejection(int rank, const std::string& text) {
  if (size_t(rank) < slots_.size() && slots_[size_t(rank)])
    write_rejection(*slots_[size_t(rank)], text);
}

std::string Group::rejection_of(int rank) const {
  if (size_t(rank) >= slots_.size() || !slots_[size_t(rank)]) return "";
  return read_rejection(*slots_[size_t(rank)]);
}

void Group::fail(int rank, const std::string& message) {
  std::lock_guard lock(mutex_);
  if (failed()) return;
  failed_rank_ = rank;
  failure_ = message;
  failed_.store(true, std::memory_order_release);
}

}  // namespace pmoe::detail
