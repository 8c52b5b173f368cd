// detail::LossBoard: how the survivors of a lost peer agree on the mask, and on the first call that
// cannot stand (AllToAllConfig::on_peer_loss = mask; the protocol and why it cannot disagree are
// in docs/robustness.md).
//
// The board is one post per rank in memory every rank loads and stores (the op's node): the ranks
// it holds lost, the calls it has finished and begun, and a count of its posts. A rank writes only
// its own post, under a sequence lock.
//
// watch() runs in the op's waits, after their spin: it notices a post naming a rank this rank
// still counts live, a node-local peer whose process ended, and a wait that has lasted the peer
// timeout, and throws PeerLossNoticed. agree() then runs the agreement: post the lost set, merge
// any larger set read, until every rank outside the set has posted exactly that set. The outcome
// is computed from those posts alone, so every survivor computes the same one.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pmoe/comm.hpp"

namespace pmoe::detail {

class Group;

// Thrown by LossBoard::watch() to end a wait; not a pmoe::Error, so no wait takes it for a
// failure. The op catches it and runs the agreement.
struct PeerLossNoticed {
  std::vector<int> suspects;         // ranks this rank found lost itself
  std::vector<std::string> reasons;  // why, one per suspect
  // The calls this rank finished and began, where the op's host counts are not the device's (a
  // device's calls end after their launch returned, and graph replays pass no host count): the
  // device's counts; -1: the op's own.
  int64_t calls_done = -1, calls_started = -1;
};

class LossBoard {
 public:
  using Clock = std::chrono::steady_clock;

  // Collective over `comm` (one small symmetric allocation). Throws pmoe::Error unless every
  // rank's memory is load/store reachable from every other.
  LossBoard(Communicator& comm, double peer_timeout_s);
  ~LossBoard();

  double peer_timeout_s() const { return peer_timeout_s_; }

  // In a wait for `peer` that began at `since`, with `live` this rank's mask: throws
  // PeerLossNoticed (see above), or returns.
  void watch(int peer, Clock::time_point since, const std::vector<uint8_t>& live);

  // For a watcher beside the op's thread (a device's kernels wait where the host cannot watch):
  // whether a live peer's process ended, or a live peer's post that changed since `seen` (its
  // post counts, updated here) holds a live rank lost. Reads only; safe beside the op's calls.
  bool news(const std::vector<uint8_t>& live, std::vector<uint64_t>& seen) const;
  // Each rank's post count when this rank last read its post (in watch, agree or join): the
  // `seen` of a watcher that starts from what this rank already took into account.
  const std::vector<uint64_t>& seen_posts() const { return seen_posts_; }

  // Before this rank writes into its peers' memory (each send step): "" while no live peer
  // holds this rank lost, else why. A rank the others went on without must not write into
  // memory their next calls use. W loads while nothing was posted.
  std::string held_lost_by(const std::vector<uint8_t>& live) const;

  struct Outcome {
    bool excluded = false;             // a survivor holds this rank lost: it cannot go on
    std::string excluded_why;
    std::vector<int> lost;             // ranks lost in this agreement, ascending
    std::vector<std::string> reasons;  // one per lost rank
    int64_t first_lost_call = 0;       // the first call some survivor did not finish
    int64_t calls_base = 0;            // the most calls any survivor began: the next is + 1
  };
  // The agreement, from this rank's mask `live`, the ranks it found lost and the calls it has
  // finished and begun. Bounded: a rank that neither posts the set nor ends within the peer
  // timeout of the last change is lost too.
  Outcome agree(const std::vector<uint8_t>& live, const PeerLossNoticed& noticed,
                int64_t calls_done, int64_t calls_started);

  // A rank that returns (rejoin, docs/robustness.md): it posts that it is joining and waits
  // until every rank outside some set L (not holding it) has posted L, between calls, with one
  // call count; it takes L as its mask and that count as its calls. Bounded by `timeout_s`.
  struct Joined {
    std::vector<uint8_t> lost;  // [W]
    int64_t calls = 0;
  };
  Joined join(double timeout_s);
  // On a live rank, in unmask_rank(rank): waits (bounded) until `rank` is joining.
  void await_joining(int rank, double timeout_s) const;
  // Posts this rank's mask and call count between calls (after unmask_rank), for a joining rank.
  void post_mask(const std::vector<uint8_t>& live, int64_t calls);

  // In a newcomer whose board memory is a lost rank's (AllToAll's Replacing constructor): makes
  // that rank's post this one's. Its count goes on from the dead writer's (peers notice a post
  // by a changed count), and a post it left half-written is finished, empty, so that readers
  // do not take it for one being written for ever.
  void take_over_post();
  // The board's memory (an op's admit hands it to a newcomer).
  SymmetricMemory& memory() const { return *memory_; }

  struct Post;

 private:
  struct Snapshot {
    uint64_t posts = 0;           // 0: never posted
    int64_t calls_done = 0, calls_started = 0;
    bool joining = false;
    std::vector<uint8_t> lost;    // [W]
  };
  Post& post_of(int r) const;
  Snapshot read(int r) const;
  void publish(const std::vector<uint8_t>& lost, int64_t calls_done, int64_t calls_started,
               bool joining = false);

  int rank_, size_;
  double peer_timeout_s_;
  std::shared_ptr<Group> group_;
  std::unique_ptr<SymmetricMemory> memory_;
  std::vector<uint64_t> seen_posts_;  // each peer's post count when this rank last read it
  uint64_t my_posts_ = 0;
};

}  // namespace pmoe::detail
