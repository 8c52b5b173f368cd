#include "comm/agree_on_step.hpp"

#include <cstring>
#include <span>

#include "pmoe/error.hpp"

namespace pmoe::detail {

void agree_on_step(Communicator& comm, const std::string& my_error, const std::string& step) {
  char text[200] = {};
  std::strncpy(text, my_error.c_str(), sizeof text - 1);
  const auto all = comm.all_gather(std::as_bytes(std::span(text)));
  for (int r = 0; r < comm.size(); ++r) {
    const char* theirs = reinterpret_cast<const char*>(all.data()) + size_t(r) * sizeof text;
    PMOE_CHECK(theirs[0] == '\0', step, " failed on rank ", r, ": ",
               std::string(theirs, strnlen(theirs, sizeof text)));
  }
}

}  // namespace pmoe::detail
