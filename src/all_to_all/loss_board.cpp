#include "all_to_all/loss_board.hpp"

#include <algorithm>
#include <atomic>
#include <thread>

#include "comm/group.hpp"
#include "comm/sequence_lock.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {

// One rank's post: this header, then W bytes (1: the rank holds that rank lost).
struct LossBoard::Post {
  uint64_t sequence;  // comm/sequence_lock.hpp
  uint64_t posts;     // posts so far; 0: never posted
  int64_t calls_done;
  int64_t calls_started;
  uint64_t joining;   // 1 while the rank waits in rejoin()
  uint8_t* lost() { return reinterpret_cast<uint8_t*>(this + 1); }
};

namespace {

constexpr auto kNap = std::chrono::microseconds(200);
constexpr int kMaxTries = 1000;  // yields while a post is being written (a write takes ~1 us)

template <typename T>
std::atomic_ref<T> word(T& x) {
  return std::atomic_ref<T>(x);
}

size_t post_bytes(int size) { return (sizeof(LossBoard::Post) + size_t(size) + 63) / 64 * 64; }

}  // namespace

LossBoard::LossBoard(Communicator& comm, double peer_timeout_s)
    : rank_(comm.rank()),
      size_(comm.size()),
      peer_timeout_s_(peer_timeout_s),
      group_(group_of(comm)),
      memory_(comm.alloc_host_symmetric(post_bytes(comm.size()))),
      seen_posts_(size_t(comm.size()), 0) {
  for (int r = 0; r < size_; ++r)
    PMOE_CHECK(memory_->peer(r) != nullptr, "AllToAll: on_peer_loss = mask needs every rank's "
               "memory load/store reachable (one node); rank ", r, " is not, from rank ", rank_);
}

LossBoard::~LossBoard() = default;

LossBoard::Post& LossBoard::post_of(int r) const {
  return *reinterpret_cast<Post*>(memory_->peer(r));
}

LossBoard::Snapshot LossBoard::read(int r) const {
  Post& post = post_of(r);
  Snapshot s;
  s.lost.resize(size_t(size_));
  auto load = [&] {
    s.posts = word(post.posts).load(std::memory_order_relaxed);
    s.calls_done = word(post.calls_done).load(std::memory_order_relaxed);
    s.calls_started = word(post.calls_started).load(std::memory_order_relaxed);
    s.joining = word(post.joining).load(std::memory_order_relaxed) != 0;
    for (int x = 0; x < size_; ++x)
      s.lost[size_t(x)] = word(post.lost()[x]).load(std::memory_order_relaxed);
  };
  for (int tries = 0; !read_sequenced(post.sequence, load); ++tries) {
    // A writer killed in the middle of its post leaves it odd for ever: read as no post.
    if (tries > kMaxTries) return Snapshot{0, 0, 0, false, std::vector<uint8_t>(size_t(size_))};
    std::this_thread::yield();
  }
  return s;
}

void LossBoard::publish(const std::vector<uint8_t>& lost, int64_t calls_done,
                        int64_t calls_started, bool joining) {
  Post& post = post_of(rank_);
  write_sequenced(post.sequence, [&] {
    word(post.posts).store(++my_posts_, std::memory_order_relaxed);
    word(post.calls_done).store(calls_done, std::memory_order_relaxed);
    word(post.calls_started).store(calls_started, std::memory_order_relaxed);
    word(post.joining).store(joining ? 1 : 0, std::memory_order_relaxed);
    for (int x = 0; x < size_; ++x)
      word(post.lost()[x]).store(lost[size_t(x)], std::memory_order_relaxed);
  });
}

void LossBoard::watch(int peer, Clock::time_point since, const std::vector<uint8_t>& live) {
  // A post that changed since this rank last read it, naming a rank still live here (or this
  // rank): join the agreement.
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || !live[size_t(r)]) continue;
    if (word(post_of(r).posts).load(std::memory_order_acquire) == seen_posts_[size_t(r)]) continue;
    const Snapshot s = read(r);
    seen_posts_[size_t(r)] = s.posts;
    for (int x = 0; x < size_; ++x)
      if (s.lost[size_t(x)] && live[size_t(x)]) throw PeerLossNoticed{};
  }
  PeerLossNoticed noticed;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || !live[size_t(r)] || !group_->peer_ended(r)) continue;
    noticed.suspects.push_back(r);
    noticed.reasons.push_back("its process ended");
  }
  if (noticed.suspects.empty() &&
      Clock::now() - since > std::chrono::duration<double>(peer_timeout_s_)) {
    noticed.suspects.push_back(peer);
    noticed.reasons.push_back(cat("awaited for more than ", peer_timeout_s_, " s"));
  }
  if (!noticed.suspects.empty()) throw noticed;
}

bool LossBoard::news(const std::vector<uint8_t>& live, std::vector<uint64_t>& seen) const {
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || !live[size_t(r)]) continue;
    if (group_->peer_ended(r)) return true;
    const uint64_t posts = word(post_of(r).posts).load(std::memory_order_acquire);
    if (posts == seen[size_t(r)]) continue;
    const Snapshot s = read(r);
    seen[size_t(r)] = s.posts;
    for (int x = 0; x < size_; ++x)
      if (s.lost[size_t(x)] && live[size_t(x)]) return true;
  }
  return false;
}

std::string LossBoard::held_lost_by(const std::vector<uint8_t>& live) const {
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || !live[size_t(r)]) continue;
    if (word(post_of(r).posts).load(std::memory_order_acquire) == seen_posts_[size_t(r)]) continue;
    if (read(r).lost[size_t(rank_)])
      return cat("rank ", r, " holds this rank lost (it did not hear from it within ",
                 peer_timeout_s_, " s)");
  }
  return {};
}

LossBoard::Outcome LossBoard::agree(const std::vector<uint8_t>& live,
                                    const PeerLossNoticed& noticed, int64_t calls_done,
                                    int64_t calls_started) {
  std::vector<uint8_t> lost(static_cast<size_t>(size_));
  std::vector<std::string> reasons(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) lost[size_t(r)] = !live[size_t(r)];
  auto lose = [&](int r, std::string why) {
    if (lost[size_t(r)]) return false;
    lost[size_t(r)] = 1;
    reasons[size_t(r)] = std::move(why);
    return true;
  };
  for (size_t i = 0; i < noticed.suspects.size(); ++i)
    if (noticed.suspects[i] != rank_) lose(noticed.suspects[i], noticed.reasons[i]);
  publish(lost, calls_done, calls_started);
  const auto patience = std::chrono::duration<double>(peer_timeout_s_);
  auto last_change = Clock::now();
  std::vector<Snapshot> posts(static_cast<size_t>(size_));
  for (;;) {
    // Merge what the others hold lost, and the peers seen ended.
    bool changed = false;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || lost[size_t(r)]) continue;
      posts[size_t(r)] = read(r);
      const Snapshot& s = posts[size_t(r)];
      if (s.posts && s.lost[size_t(rank_)]) {
        Outcome out;
        out.excluded = true;
        out.excluded_why = held_lost_by(live);
        return out;
      }
      if (s.posts)
        for (int x = 0; x < size_; ++x)
          if (s.lost[size_t(x)] && x != rank_) changed |= lose(x, cat("found lost by rank ", r));
      if (group_->peer_ended(r)) changed |= lose(r, "its process ended");
    }
    if (!changed) {
      // Agreed once every rank outside the set has posted exactly this set.
      std::vector<int> silent;
      for (int r = 0; r < size_; ++r) {
        if (r == rank_ || lost[size_t(r)]) continue;
        const Snapshot& s = posts[size_t(r)];
        if (!s.posts || s.lost != lost) silent.push_back(r);
      }
      if (silent.empty()) break;
      if (Clock::now() - last_change > patience)
        for (int r : silent)
          changed |= lose(r, cat("did not join the survivors' agreement within ",
                                 peer_timeout_s_, " s"));
    }
    if (changed) {
      publish(lost, calls_done, calls_started);
      last_change = Clock::now();
      continue;
    }
    std::this_thread::sleep_for(kNap);
  }

  Outcome out;
  out.first_lost_call = calls_done + 1;
  out.calls_base = calls_started;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && !lost[size_t(r)]) {
      out.first_lost_call = std::min(out.first_lost_call, posts[size_t(r)].calls_done + 1);
      out.calls_base = std::max(out.calls_base, posts[size_t(r)].calls_started);
      seen_posts_[size_t(r)] = posts[size_t(r)].posts;
    }
    if (lost[size_t(r)] && live[size_t(r)]) {
      out.lost.push_back(r);
      out.reasons.push_back(reasons[size_t(r)]);
    }
  }
  return out;
}

void LossBoard::post_mask(const std::vector<uint8_t>& live, int64_t calls) {
  std::vector<uint8_t> lost(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) lost[size_t(r)] = !live[size_t(r)];
  publish(lost, calls, calls);
}

void LossBoard::take_over_post() {
  Post& post = post_of(rank_);
  std::atomic_ref<uint64_t> sequence(post.sequence);
  my_posts_ = word(post.posts).load(std::memory_order_relaxed);
  const uint64_t at = sequence.load(std::memory_order_relaxed);
  if (at % 2 == 0) return publish(std::vector<uint8_t>(size_t(size_)), 0, 0);
  // Odd: the writer died inside write_sequenced. Finish that write, then make it whole.
  word(post.posts).store(++my_posts_, std::memory_order_relaxed);
  word(post.calls_done).store(0, std::memory_order_relaxed);
  word(post.calls_started).store(0, std::memory_order_relaxed);
  word(post.joining).store(0, std::memory_order_relaxed);
  for (int x = 0; x < size_; ++x) word(post.lost()[x]).store(0, std::memory_order_relaxed);
  sequence.store(at + 1, std::memory_order_release);
}

void LossBoard::await_joining(int rank, double timeout_s) const {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (!read(rank).joining) {
    group_->check_failed(rank_);
    PMOE_CHECK(Clock::now() < deadline, "AllToAll::unmask_rank on rank ", rank_, ": rank ", rank,
               " did not call rejoin() within ", timeout_s, " s; nothing changed");
    std::this_thread::sleep_for(kNap);
  }
}

LossBoard::Joined LossBoard::join(double timeout_s) {
  const std::vector<uint8_t> none(static_cast<size_t>(size_), 0);
  publish(none, 0, 0, /*joining=*/true);
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    group_->check_failed(rank_);
    // A set L that every rank outside it (this one aside) has posted, between calls, with one
    // call count: L's ranks are masked, the others have all unmasked this rank.
    std::vector<Snapshot> posts(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r)
      if (r != rank_) posts[size_t(r)] = read(r);
    auto agreed_on = [&](const Snapshot& model) {
      if (!model.posts || model.lost[size_t(rank_)] || model.calls_done != model.calls_started)
        return false;
      for (int r = 0; r < size_; ++r) {
        if (r == rank_ || model.lost[size_t(r)]) continue;
        const Snapshot& s = posts[size_t(r)];
        if (!s.posts || s.lost != model.lost || s.calls_started != model.calls_started ||
            s.calls_done != model.calls_done)
          return false;
      }
      return true;
    };
    const Snapshot* model = nullptr;
    for (int r = 0; r < size_ && !model; ++r)
      if (r != rank_ && agreed_on(posts[size_t(r)])) model = &posts[size_t(r)];
    const bool agreed = model != nullptr;
    if (agreed) {
      Joined out{model->lost, model->calls_started};
      publish(out.lost, out.calls, out.calls);
      for (int r = 0; r < size_; ++r)
        if (r != rank_) seen_posts_[size_t(r)] = posts[size_t(r)].posts;
      return out;
    }
    PMOE_CHECK(Clock::now() < deadline, "AllToAll::rejoin on rank ", rank_, ": the live ranks "
               "did not all unmask this rank within ", timeout_s, " s (each calls "
               "unmask_rank(", rank_, ") between the same two calls)");
    std::this_thread::sleep_for(kNap);
  }
}

}  // namespace pmoe::detail
