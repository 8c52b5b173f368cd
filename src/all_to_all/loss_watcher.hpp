// detail::LossWatcher: a thread that watches the loss board for a device op. A device's kernels
// wait where the op's host thread cannot watch (it has returned to the caller, or sits in a
// stream synchronisation), so this thread polls the board and the pid watch instead, and on news
// calls on_news() once: the CUDA backend sets the abort word its kernels' waits poll, so that they
// end and the host thread joins the agreement at its next call (docs/robustness.md).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pmoe::detail {

class LossBoard;

class LossWatcher {
 public:
  // Watches nothing until restart().
  LossWatcher(const LossBoard& board, std::function<void()> on_news);
  ~LossWatcher();
  LossWatcher(const LossWatcher&) = delete;
  LossWatcher& operator=(const LossWatcher&) = delete;

  // From now on, news about the ranks `live` holds live; posts counted in `seen` are known. Also
  // re-arms on_news() after it fired.
  void restart(const std::vector<uint8_t>& live, const std::vector<uint64_t>& seen);

 private:
  void run();

  const LossBoard& board_;
  std::function<void()> on_news_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool armed_ = false;  // watching; false before restart() and once on_news() fired
  std::vector<uint8_t> live_;
  std::vector<uint64_t> seen_;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace pmoe::detail
