// Symmetric memory whose node-local peers are loaded and stored directly and whose other peers
// are reached through a message transport (MPI messages, pmoe's TCP mesh): the one shape the
// MPI and socket communicators share. `Regions` owns the mappings and the transport (the
// keepalive) and names the allocation (`serial`); `Transport` has put(r, serial, offset, src,
// bytes), signal(r, serial, slot, value) and progress().
#pragma once

#include <memory>
#include <vector>

#include "pmoe/comm.hpp"

namespace pmoe::detail {

template <typename Transport, typename Regions>
class RoutedSymmetricMemory final : public SymmetricMemory {
 public:
  RoutedSymmetricMemory(int rank, size_t bytes, int signal_slots, std::vector<std::byte*> data,
                        std::vector<uint64_t*> signals, std::shared_ptr<Regions> regions,
                        std::shared_ptr<Group> group, double timeout_s, Device device)
      : SymmetricMemory(rank, bytes, signal_slots, std::move(data), std::move(signals), regions,
                        std::move(group), timeout_s, device),
        transport_(*regions->transport),
        serial_(regions->serial) {
    for (int r = 0; r < size(); ++r) has_remote_peers_ = has_remote_peers_ || peer(r) == nullptr;
    // A remote signal arrives in a message that only progress() applies: waits must poll, not
    // block on the signal word.
    if (has_remote_peers_) set_polled_transport();
  }

  void put(int r, size_t offset, const void* src, size_t bytes) override {
    if (peer(r)) return SymmetricMemory::put(r, offset, src, bytes);
    transport_.put(r, serial_, offset, src, bytes);
  }

  void signal(int r, int slot, uint64_t value) override {
    if (peer(r)) return SymmetricMemory::signal(r, slot, value);
    transport_.signal(r, serial_, slot, value);
  }

 protected:
  // Only off-node traffic needs the transport: with every peer on the node, waits call nothing
  // of it (so a second thread of an MPI rank may wait too under MPI_THREAD_SERIALIZED).
  void progress() const override {
    if (has_remote_peers_) transport_.progress();
  }

 private:
  Transport& transport_;  // owned through the regions (the keepalive)
  uint64_t serial_;
  bool has_remote_peers_ = false;
};

}  // namespace pmoe::detail
