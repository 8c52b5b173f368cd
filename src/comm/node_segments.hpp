// Node peers' memory through POSIX shared memory, the set-up both the MPI and the socket
// communicators' alloc_symmetric run: each rank creates its segment, maps its node peers', and
// unlinks its name once every peer has mapped it. If set-up fails anywhere (a peer died,
// /dev/shm is full), every rank unlinks every node peer's name as it leaves: a name whose creator
// was killed between create and unlink is removed by the survivors.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "comm/shm_segment.hpp"

namespace pmoe::detail {

// Ends a set-up step on every rank: agree(my_error, step) throws on every rank if any failed
// (agree_on_step with the caller's wording).
using AgreeOnStep = std::function<void(const std::string& my_error, const char* step)>;

// Collective over the ranks that call it. Appends the segments mapped to `segments` and sets
// data[r] for this rank and each of `node_ranks`; `total` bytes each, named name_of(r).
// before_last_step runs once the peers are mapped, before the step after which peers may write
// (the socket transport registers the region there). keep_fds: every segment keeps its file
// descriptor (ShmSegment::create), for a later hand-over to a process in a lost rank's place.
void map_node_segments(std::vector<ShmSegment>& segments, std::vector<std::byte*>& data,
                       size_t total, int rank, const std::vector<int>& node_ranks,
                       const std::function<std::string(int)>& name_of, const AgreeOnStep& agree,
                       const std::function<void()>& before_last_step = {},
                       bool keep_fds = false);

}  // namespace pmoe::detail
