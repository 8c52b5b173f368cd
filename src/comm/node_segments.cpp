#include "comm/node_segments.hpp"

#include "pmoe/error.hpp"

namespace pmoe::detail {

void map_node_segments(std::vector<ShmSegment>& segments, std::vector<std::byte*>& data,
                       size_t total, int rank, const std::vector<int>& node_ranks,
                       const std::function<std::string(int)>& name_of, const AgreeOnStep& agree,
                       const std::function<void()>& before_last_step, bool keep_fds) {
  struct UnlinkOnFailure {
    const std::vector<int>& ranks;
    const std::function<std::string(int)>& name_of;
    bool armed = true;
    ~UnlinkOnFailure() {
      if (armed)
        for (int r : ranks) ShmSegment::unlink(name_of(r));
    }
  } guard{node_ranks, name_of};
  std::string error;
  try {
    segments.push_back(ShmSegment::create(name_of(rank), total, keep_fds));
    data[size_t(rank)] = segments.back().data();
  } catch (const Error& e) {
    error = e.what();
  }
  agree(error, "create");
  for (int r : node_ranks) {
    if (r == rank) continue;
    try {
      segments.push_back(ShmSegment::open(name_of(r), total, keep_fds));
      data[size_t(r)] = segments.back().data();
    } catch (const Error& e) {
      error = e.what();
    }
  }
  if (before_last_step) before_last_step();
  agree(error, "map");
  guard.armed = false;
  ShmSegment::unlink(name_of(rank));  // every peer has mapped it: drop the name
}

}  // namespace pmoe::detail
