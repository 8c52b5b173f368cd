#include "all_to_all/loss_watcher.hpp"

#include <chrono>
#include <utility>

#include "all_to_all/loss_board.hpp"

namespace pmoe::detail {

namespace {
// Well inside the 100 ms from a death to the mask that the policy promises; the pid watch
// rate-limits its own checks.
constexpr auto kPoll = std::chrono::milliseconds(1);
}  // namespace

LossWatcher::LossWatcher(const LossBoard& board, std::function<void()> on_news)
    : board_(board), on_news_(std::move(on_news)), thread_([this] { run(); }) {}

LossWatcher::~LossWatcher() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void LossWatcher::restart(const std::vector<uint8_t>& live, const std::vector<uint64_t>& seen) {
  {
    std::lock_guard lock(mutex_);
    live_ = live;
    seen_ = seen;
    armed_ = true;
  }
  wake_.notify_all();
}

void LossWatcher::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (armed_ && board_.news(live_, seen_)) {
      armed_ = false;
      on_news_();
    }
    wake_.wait_for(lock, kPoll, [this] { return stop_; });
  }
}

}  // namespace pmoe::detail
