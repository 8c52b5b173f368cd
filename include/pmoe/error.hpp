// pmoe's one error policy: the library never exits or aborts on a caller's mistake; it throws
// pmoe::Error with what was expected and what came. PMOE_CHECK is the one way to raise it.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace pmoe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
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
