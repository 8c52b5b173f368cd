// detail::Group: what every wait of a rank consults besides its own flag. Thread groups record
// the first failure of any rank, so that the others stop waiting at once; MPI groups drive
// progress of one-sided transfers.
#pragma once

#include <atomic>
#include <mutex>
#include <string>

namespace pmoe::detail {

class Group {
 public:
  virtual ~Group() = default;

  // Throws pmoe::Error if a rank of this group has failed. `rank` is the caller's rank.
  void check(int rank) const;
  // Records that `rank` failed with `message`; only the first failure is kept.
  void fail(int rank, const std::string& message);
  bool failed() const { return failed_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;
  int failed_rank_ = -1;
  std::string failure_;
};

}  // namespace pmoe::detail
