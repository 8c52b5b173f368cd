// detail::Group: what every wait of a rank consults besides its own flag. Thread groups record
// the first failure of any rank, so that the others stop waiting at once; MPI groups also watch
// their node-local peer processes (PeerWatch), so that one that died is named within a fraction
// of a second.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/rejection_board.hpp"

namespace pmoe::detail {

class PeerWatch;

class Group {
 public:
  virtual ~Group();

  // Throws pmoe::Error if a rank of this group has failed or, where peers are watched, if a
  // peer's process has ended. `rank` is the caller's rank.
  void check(int rank);
  // The same without the watch: for an op that decides itself what an ended peer means
  // (AllToAllConfig::on_peer_loss = mask), asking peer_ended().
  void check_failed(int rank);
  // Whether rank r's process is known to have ended (node-local peers; false where unwatched).
  // Rate-limited as the watch is: between its checks it only reads the clock.
  bool peer_ended(int r);
  // Records that `rank` failed with `message`; only the first failure is kept.
  void fail(int rank, const std::string& message);
  bool failed() const { return failed_.load(std::memory_order_acquire); }

  // Set once, at set-up, before any wait.
  void set_peer_watch(std::shared_ptr<PeerWatch> watch) { watch_ = std::move(watch); }
  const std::shared_ptr<PeerWatch>& peer_watch() const { return watch_; }

  // The rejection board (rejection_board.hpp): slots[r] is rank r's slot, or null where this
  // process cannot see it. Set once, at set-up; `keepalive` owns the memory.
  void set_rejection_slots(std::vector<RejectionSlot*> slots, std::shared_ptr<void> keepalive) {
    slots_ = std::move(slots);
    slots_keepalive_ = std::move(keepalive);
  }
  // Records (or, with "", clears) what `rank` rejected.
  void note_rejection(int rank, const std::string& text);
  // What `rank` last rejected, or "" (none, cleared since, or out of sight).
  std::string rejection_of(int rank) const;

 private:
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;
  int failed_rank_ = -1;
  std::string failure_;
  std::shared_ptr<PeerWatch> watch_;
  std::vector<RejectionSlot*> slots_;
  std::shared_ptr<void> slots_keepalive_;
};

}  // namespace pmoe::detail
