// What a careful user writes without pmoe, minus pmoe: MPI_Alltoallv between MPI processes, and
// its plain-copy equivalent between thread ranks (each rank copies its blocks out of the peers'
// send buffers between two barriers). pmoe-bench's baselines are built on it.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "pmoe/comm.hpp"

namespace pmoe::bench {

class ByteAllToAllV {
 public:
  // Collective. Every rank may send up to `max_send_bytes` per exchange.
  ByteAllToAllV(Communicator& comm, size_t max_send_bytes);
  ~ByteAllToAllV();

  // Where the caller packs what it sends (max_send_bytes).
  std::byte* send_buffer() const;

  // Collective: rank r's block for rank d is send_counts[d] bytes at send_displs[d] of
  // send_buffer(); the block from rank s lands at recv + recv_displs[s], recv_counts[s] bytes.
  void exchange(const std::vector<size_t>& send_counts, const std::vector<size_t>& send_displs,
                std::byte* recv, const std::vector<size_t>& recv_counts,
                const std::vector<size_t>& recv_displs);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Collective: counts [W, n]; row d goes to rank d. Returns [W, n]: row s is what rank s sent
// this rank (the counts exchange in front of an all-to-all-v: MPI_Alltoall, or copies between
// threads).
std::vector<int64_t> exchange_counts(Communicator& comm, const std::vector<int64_t>& counts,
                                     int n);

}  // namespace pmoe::bench
