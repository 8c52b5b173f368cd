// Puts and signals to peers on other nodes, as two-sided MPI messages that the target applies to
// its own symmetric memory whenever it polls (every pmoe wait polls).
//
// Why not MPI one-sided puts: ordering data before its signal needs MPI_Win_flush, which blocks
// with no deadline until the target makes MPI progress. Here every step is a non-blocking call
// completed by pmoe's bounded wait, so a peer that never arrives is named, not waited on forever.
//
// Wire format on the transport's own communicator: a Header (tag kHeaderTag), then for a put its
// payload (tag kPayloadTag). MPI keeps messages of one tag between two ranks in order, so a
// signal's header is applied after the payloads put before it.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pmoe::detail {

class MpiTransport {
 public:
  MpiTransport(MPI_Comm comm, int rank, double timeout_s);  // duplicates comm
  ~MpiTransport();

  // Makes allocation `serial` (data at `base`, signals at `signals`) a target for messages.
  void add_region(uint64_t serial, std::byte* base, uint64_t* signals);
  void remove_region(uint64_t serial);

  // Both return once `src` may be reused; they poll incoming messages while they wait.
  void put(int peer, uint64_t serial, size_t offset, const void* src, size_t bytes);
  void signal(int peer, uint64_t serial, int slot, uint64_t value);

  // Applies every message that has arrived. Called from every pmoe wait.
  void progress();

 private:
  struct Header {
    uint64_t serial, offset, bytes, slot, value, is_signal;
  };
  struct Region {
    std::byte* base;
    uint64_t* signals;
  };
  void send(int peer, const Header& header, const void* payload);
  void complete(std::vector<MPI_Request>& requests, int peer, const char* what);
  template <typename PollSide>
  void wait_all(std::vector<MPI_Request>& requests, PollSide&& poll_side, const std::string& late);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_;
  double timeout_s_;
  std::map<uint64_t, Region> regions_;
  std::vector<std::byte> discard_;  // payloads for regions already freed
};

}  // namespace pmoe::detail
