// detail::PeerWatch: notices within a fraction of a second that a node-local peer process has
// ended (killed, crashed, exited), so that a wait on it fails at once and names it instead of
// sitting out the whole timeout.
//
// How: a pidfd per peer (Linux >= 5.3), which becomes readable when that process ends, zombie or
// not, and which can never point at a later process that reuses the pid. Where pidfd_open is
// refused (old kernel, seccomp) it falls back to kill(pid, 0), which a zombie still passes (the
// launcher reaps its children quickly, so that costs little). One check is one poll() per peer,
// about a microsecond; waits run it at most every kCheckInterval, so a busy wait costs nothing and
// a dead peer is named within that interval.
//
// Peers in another pid namespace (separate containers sharing /dev/shm) are not watched: their pid
// means nothing here. Off-node peers are not watched either; MPI and the timeout cover them.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pmoe::detail {

class PeerWatch {
 public:
  static constexpr auto kCheckInterval = std::chrono::milliseconds(20);

  // What one rank publishes about itself at set-up.
  struct Identity {
    int64_t pid;
    uint64_t pid_namespace;  // inode of /proc/self/ns/pid (0 if unreadable)
  };
  static Identity self();

  // Watches `peers` (world ranks) whose identities are `identities[rank]`; skips this rank and
  // peers in another pid namespace.
  PeerWatch(int rank, const std::vector<int>& peers, const std::vector<Identity>& identities);
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // Returns "" while every watched peer lives, else a sentence naming every one that ended (rank
  // and pid). Rate-limited: between checks it only reads the clock. An ended peer stays ended.
  std::string poll();
  // Whether `rank` is a watched peer that has ended (rate-limited as poll()).
  bool ended(int rank);
  // A new process took `rank`'s place (SocketCommunicator::admit): watch it instead of the one
  // that ended. Between calls only: no other thread of this process may wait meanwhile.
  void rewatch(int rank, const Identity& theirs, const Identity& mine);

 private:
  struct Peer {
    int rank;
    int64_t pid;
    int pidfd;  // -1: kill(pid, 0) instead
  };
  bool process_ended(const Peer& peer) const;
  void refresh();  // at most once per kCheckInterval: marks the peers that ended since

  std::vector<Peer> peers_;
  std::unique_ptr<std::atomic<bool>[]> ended_;  // [peers_.size()], sticky
  std::atomic<int64_t> next_check_ns_{0};
};

}  // namespace pmoe::detail
