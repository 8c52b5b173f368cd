#include "comm/peer_watch.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

int open_pidfd(int64_t pid) {
#ifdef SYS_pidfd_open
  const long fd = syscall(SYS_pidfd_open, pid_t(pid), 0);
  return fd >= 0 ? int(fd) : -1;
#else
  return -1;
#endif
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

PeerWatch::Identity PeerWatch::self() {
  struct stat ns = {};
  const uint64_t inode = stat("/proc/self/ns/pid", &ns) == 0 ? uint64_t(ns.st_ino) : 0;
  return {int64_t(getpid()), inode};
}

PeerWatch::PeerWatch(int rank, const std::vector<int>& peers,
                     const std::vector<Identity>& identities) {
  const Identity mine = identities[size_t(rank)];
  for (int r : peers) {
    const Identity& theirs = identities[size_t(r)];
    if (r == rank || mine.pid_namespace == 0 || theirs.pid_namespace != mine.pid_namespace)
      continue;
    peers_.push_back({r, theirs.pid, open_pidfd(theirs.pid)});
  }
  ended_ = std::make_unique<std::atomic<bool>[]>(peers_.size());
}

PeerWatch::~PeerWatch() {
  for (const Peer& peer : peers_)
    if (peer.pidfd >= 0) ::close(peer.pidfd);
}

bool PeerWatch::process_ended(const Peer& peer) const {
  if (peer.pidfd >= 0) {
    pollfd entry{peer.pidfd, POLLIN, 0};
    return ::poll(&entry, 1, 0) > 0;  // readable once the process has ended
  }
  return ::kill(pid_t(peer.pid), 0) != 0 && errno == ESRCH;
}

void PeerWatch::refresh() {
  if (peers_.empty()) return;
  const int64_t now = now_ns();
  int64_t next = next_check_ns_.load(std::memory_order_relaxed);
  if (now < next) return;
  // One waiter per interval does the check; the others go back to waiting.
  const int64_t interval =
      std::chrono::duration_cast<std::chrono::nanoseconds>(kCheckInterval).count();
  if (!next_check_ns_.compare_exchange_strong(next, now + interval, std::memory_order_relaxed))
    return;
  for (size_t i = 0; i < peers_.size(); ++i)
    if (!ended_[i].load(std::memory_order_relaxed) && process_ended(peers_[i]))
      ended_[i].store(true, std::memory_order_relaxed);
}

bool PeerWatch::ended(int rank) {
  refresh();
  for (size_t i = 0; i < peers_.size(); ++i)
    if (peers_[i].rank == rank) return ended_[i].load(std::memory_order_relaxed);
  return false;
}

void PeerWatch::rewatch(int rank, const Identity& theirs, const Identity& mine) {
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i].rank != rank) continue;
    if (peers_[i].pidfd >= 0) ::close(peers_[i].pidfd);
    peers_.erase(peers_.begin() + ptrdiff_t(i));
    break;
  }
  if (mine.pid_namespace != 0 && theirs.pid_namespace == mine.pid_namespace)
    peers_.push_back({rank, theirs.pid, open_pidfd(theirs.pid)});
  // The flags follow the peers' order, which just changed: read each one's state afresh.
  ended_ = std::make_unique<std::atomic<bool>[]>(peers_.size());
  next_check_ns_.store(0, std::memory_order_relaxed);
  refresh();
}

std::string PeerWatch::poll() {
  refresh();
  // Every ended peer is named: survivors that noticed the first death leave too, and a check
  // that comes late may see them as well as the one that caused it.
  std::string ended_ranks;
  int count = 0;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (!ended_[i].load(std::memory_order_relaxed)) continue;
    ended_ranks += cat(count++ ? ", " : "", peers_[i].rank, " (pid ", peers_[i].pid, ")");
  }
  if (count == 0) return {};
  return cat(count == 1 ? "the process of rank " : "the processes of ranks ", ended_ranks,
             count == 1 ? " has" : " have",
             " ended on this node (killed, crashed or exited) in the middle of the group's work");
}

}  // namespace pmoe::detail
