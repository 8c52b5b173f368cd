// What a CUDA AllToAll adds for on_peer_loss = mask (docs/robustness.md): the abort word its
// kernels' waits poll, in host-mapped memory, and the watcher thread that sets it when the loss
// board has news. The kernels' own waits end on a peer that stays silent for the peer timeout;
// the word ends them when the news comes from elsewhere (a dead process, another survivor's
// post), so that every survivor's kernels end and its host joins the agreement at its next call.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "all_to_all/loss_board.hpp"
#include "all_to_all/loss_watcher.hpp"

namespace pmoe::detail {

class DevicePeerLoss {
 public:
  // `abort_word`: the host's view of the word the kernels poll (zeroed).
  explicit DevicePeerLoss(int32_t* abort_word) : abort_(abort_word) {}

  // Starts watching `board` for the ranks `live` holds live.
  void attach(LossBoard& board, const std::vector<uint8_t>& live) {
    board_ = &board;
    watcher_ = std::make_unique<LossWatcher>(board, [this] { set_abort(); });
    watcher_->restart(live, board.seen_posts());
  }

  bool abort_set() const { return word().load(std::memory_order_acquire) != 0; }
  // Ends every wait of this rank's kernels, now and until restart().
  void set_abort() const { word().store(1, std::memory_order_release); }

  // From now on (after an agreement, a rejoin or an unmask): the ranks `live` holds live; with
  // `clear`, the kernels wait again (the caller has synchronised the stream: none is waiting).
  void restart(const std::vector<uint8_t>& live, bool clear) {
    if (clear) word().store(0, std::memory_order_release);
    if (watcher_) watcher_->restart(live, board_->seen_posts());
  }

 private:
  std::atomic_ref<int32_t> word() const { return std::atomic_ref<int32_t>(*abort_); }

  int32_t* abort_;
  LossBoard* board_ = nullptr;
  std::unique_ptr<LossWatcher> watcher_;  // last: its thread calls set_abort()
};

}  // namespace pmoe::detail
