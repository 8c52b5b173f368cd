#include "comm/agree_on_step.hpp"

#include <cstring>
#include <exception>
#include <span>

#include "pmoe/error.hpp"

namespace pmoe::detail {

void agree_on_step(Communicator& comm, const std::string& my_error, const std::string& step) {
  char text[480] = {};  // set-up only: room for a library's reason (NCCL's, a path)
  std::strncpy(text, my_error.c_str(), sizeof text - 1);
  const auto all = comm.all_gather(std::as_bytes(std::span(text)));
  for (int r = 0; r < comm.size(); ++r) {
    const char* theirs = reinterpret_cast<const char*>(all.data()) + size_t(r) * sizeof text;
    PMOE_CHECK(theirs[0] == '\0', step, " failed on rank ", r, ": ",
               std::string(theirs, strnlen(theirs, sizeof text)));
  }
}

std::string failure_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const std::exception& e) {
    return e.what()[0] ? e.what() : "(no message)";  // "" would read as success
  }
  return {};
}

void agree_on_step(Communicator& comm, const std::function<void()>& run, const std::string& step) {
  agree_on_step(comm, failure_of(run), step);
}

}  // namespace pmoe::detail
