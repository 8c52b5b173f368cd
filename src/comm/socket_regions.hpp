// What one symmetric allocation of a SocketCommunicator owns: the mappings of this rank's and its
// node peers' segments (on a GPU: its device memory and the peers' IPC mappings), and its
// registration with the transport. socket_communicator.cpp makes it; socket_admission.cpp hands
// its segments to a process that takes a lost rank's place.
#pragma once

#include <memory>
#include <vector>

#include "comm/device_segments.hpp"
#include "comm/shm_segment.hpp"
#include "comm/socket_transport.hpp"

namespace pmoe::detail {

struct SocketRegions {
  std::vector<ShmSegment> segments;
  std::vector<int> segment_ranks;  // the rank whose memory each of `segments` is
  DeviceSegments device_segments;
  std::shared_ptr<SocketTransport> transport;
  uint64_t serial = 0;
  ~SocketRegions() {
    if (transport) transport->remove_region(serial);
  }
};

// One rank's part of alloc_symmetric's first exchange, which hand_over() also makes: a peer that
// maps a larger segment than its creator made would fault on touching the end, and a newcomer
// must take over an allocation exactly when every survivor hands one over.
struct AllocationRequest {
  uint64_t bytes, signal_slots;
  int64_t handed_to;  // the newcomer being given the allocation (hand_over), else -1
  uint64_t serial;    // the allocation handed over (hand_over), else 0
};

// Checks every rank's request (`gathered`, in rank order) against this rank's, the same way on
// every rank: sizes equal, and either nobody hands over or every rank but one hands the same
// allocation to that one. Returns that rank (its allocation is `*serial`), or -1 for a fresh
// allocation; throws pmoe::Error otherwise.
int agreed_hand_over(int rank, const std::vector<std::byte>& gathered,
                     const AllocationRequest& mine, uint64_t* serial);

}  // namespace pmoe::detail
