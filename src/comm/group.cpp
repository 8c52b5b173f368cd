#include "comm/group.hpp"

#include "comm/peer_watch.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {

Group::~Group() = default;

void Group::check(int rank) {
  if (!failed() && watch_) {
    const std::string why = watch_->poll();
    if (!why.empty()) fail(kPeerEnded, why);
  }
  if (!failed()) return;
  std::lock_guard lock(mutex_);
  if (failed_rank_ == kPeerEnded)
    throw Error(cat("rank ", rank, ": stopped waiting because ", failure_));
  throw Error(cat("rank ", rank, ": stopped waiting because rank ", failed_rank_,
                  " failed: ", failure_));
}

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
