// pmoe's one error policy: the library never exits or aborts on a caller's mistake; it throws
// pmoe::Error with what was expected and what came. PMOE_CHECK is the one way to raise it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pmoe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Thrown by a call of an op made with on_peer_loss = mask when peers were lost during it. The
// survivors agreed on a new mask (the ranks below are masked from the next call on) and on the
// first call that cannot stand: calls first_call() .. last_call() of this rank are lost, the
// current one and, where this rank had finished it before another survivor could, the one before.
// Their outputs must not be used: run their tokens again. The op stays usable; the next call is
// numbered the same on every survivor (AllToAll::calls_started() + 1).
class PeerLost : public Error {
 public:
  PeerLost(const std::string& message, std::vector<int> ranks, int64_t first_call,
           int64_t last_call)
      : Error(message), ranks_(std::move(ranks)), first_call_(first_call), last_call_(last_call) {}
  const std::vector<int>& ranks() const { return ranks_; }  // newly masked, ascending
  // This rank's lost calls, numbered from 1. None (first_call() == last_call() + 1) where a
  // device's check_errors() found the loss after every call of this rank had finished.
  int64_t first_call() const { return first_call_; }
  int64_t last_call() const { return last_call_; }

 private:
  std::vector<int> ranks_;
  int64_t first_call_, last_call_;
};

namespace detail {

// Joins any streamable arguments into one string: cat("m = ", m, " > ", limit).
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

}  // namespace detail
}  // namespace pmoe

// Throws pmoe::Error(message) unless `cond` holds. The message is built only on failure.
#define PMOE_CHECK(cond, ...)                                   \
  do {                                                          \
    if (!(cond)) throw ::pmoe::Error(::pmoe::detail::cat(__VA_ARGS__)); \
  } while (0)
