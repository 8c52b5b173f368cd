// A new process in a lost rank's place on the socket mesh (docs/robustness.md, "A new process in
// a dead one's place"): the newcomer connects to every survivor, which accepts it on the listener
// it kept; every rank then checks the job's picture and watches the new process; the lowest
// survivor of the node opens a Unix socket to the newcomer, over which each op's admit later
// passes the descriptors of its segments (their names were unlinked at set-up, and stay so).
//
// Why the newcomer takes over the dead rank's segments rather than making new ones: the survivors'
// mappings of them stay valid, so nothing they hold (pointers in ops, in kernels' arguments,
// in captured graphs) has to change, and an op's admit is the same exchange on every survivor.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <span>

#include "comm/agree_on_step.hpp"
#include "comm/fd_passing.hpp"
#include "comm/group.hpp"
#include "comm/node_occupancy.hpp"
#include "comm/peer_watch.hpp"
#include "comm/shm_segment.hpp"
#include "comm/socket_regions.hpp"
#include "pmoe/error.hpp"
#include "pmoe/socket_communicator.hpp"

namespace pmoe {
namespace detail {

int agreed_hand_over(int rank, const std::vector<std::byte>& gathered,
                     const AllocationRequest& mine, uint64_t* serial) {
  const size_t size = gathered.size() / sizeof(AllocationRequest);
  std::vector<AllocationRequest> all(size);
  std::memcpy(all.data(), gathered.data(), gathered.size());
  for (size_t r = 0; r < size; ++r)
    PMOE_CHECK(all[r].bytes == mine.bytes && all[r].signal_slots == mine.signal_slots,
               "alloc_symmetric on rank ", rank, ": rank ", r, " asks for ", all[r].bytes,
               " bytes and ", all[r].signal_slots, " signals, this rank for ", mine.bytes, " and ",
               mine.signal_slots, " (the ranks disagree on the op's config)");
  // The newcomer is the one rank that does not hand over, if anyone does.
  int64_t target = -1;
  for (size_t r = 0; r < size && target < 0; ++r) target = all[r].handed_to;
  if (target < 0) return -1;
  for (size_t r = 0; r < size; ++r) {
    const bool ok = int64_t(r) == target ? all[r].handed_to == -1
                                         : all[r].handed_to == target &&
                                               all[r].serial == all[size_t(target == 0)].serial;
    PMOE_CHECK(ok, "alloc_symmetric on rank ", rank, ": ranks out of step: some hand an "
               "allocation over to rank ", target, " (an op's admit) while rank ", r, " ",
               all[r].handed_to == -1 ? std::string("allocates one")
                                      : cat("hands one to rank ", all[r].handed_to),
               "; every survivor admits the same op while the newcomer builds it");
  }
  *serial = all[size_t(target == 0)].serial;
  return int(target);
}

}  // namespace detail

namespace {
using detail::PeerWatch;

// What every rank tells the others once a newcomer's connections are up.
struct Welcome {
  uint64_t digest;
  uint64_t allocations;  // the survivors' count, which the newcomer takes
  PeerWatch::Identity identity;
};
}  // namespace

std::unique_ptr<SocketCommunicator> SocketCommunicator::replacing(
    Listener&& listener, int rank, std::vector<std::string> addresses,
    std::vector<std::string> nodes, std::string job_id, Device device) {
  return std::unique_ptr<SocketCommunicator>(
      new SocketCommunicator(Replacing{}, std::move(listener), rank, std::move(addresses),
                             std::move(nodes), std::move(job_id), device));
}

SocketCommunicator::SocketCommunicator(Replacing, Listener&& listener, int rank,
                                       std::vector<std::string> addresses,
                                       std::vector<std::string> nodes, std::string job_id,
                                       Device device)
    : Communicator(std::make_shared<detail::Group>(), device),
      rank_(rank),
      size_(int(addresses.size())),
      job_id_(std::move(job_id)) {
  const char* op = "SocketCommunicator::replacing";
  PMOE_CHECK(listener.fd_ >= 0, op, ": the listener was already used");
  PMOE_CHECK(size_ >= 2 && rank >= 0 && rank < size_, op, ": rank ", rank, " outside [0, ", size_,
             ") or no other rank to join");
  PMOE_CHECK(nodes.size() == addresses.size(), op, ": ", addresses.size(), " addresses but ",
             nodes.size(), " node names");
  for (size_t r = 0; r < nodes.size(); ++r)
    PMOE_CHECK(nodes[r] == nodes[size_t(rank)], op, ": rank ", r, " is on node '", nodes[r],
               "', not on this one ('", nodes[size_t(rank)], "'); a newcomer joins a group on "
               "one node only (the survivors refuse it otherwise)");
  PMOE_CHECK(!job_id_.empty() && job_id_.find('/') == std::string::npos, op,
             ": job_id must be non-empty and free of '/', got '", job_id_, "'");
  PMOE_CHECK(device.kind == Device::Kind::cpu, op, ": a newcomer on ", device.str(),
             " is not built yet (its device memory would have to be handed over through CUDA IPC "
             "handles of the lost rank's allocations); the CPU only");
  addresses_ = std::move(addresses);
  nodes_ = std::move(nodes);
  transport_ = std::make_shared<detail::SocketTransport>(
      detail::SocketTransport::Replacing{}, std::exchange(listener.fd_, -1), rank, addresses_,
      timeout_s());
  // The survivors learn this rank's new address from it (for a later newcomer of another rank).
  const std::string& mine = addresses_[size_t(rank_)];
  for (int r = 0; r < size_; ++r)
    if (r != rank_) transport_->send_message(r, std::as_bytes(std::span(mine)));
  for (int r = 0; r < size_; ++r)
    if (nodes_[size_t(r)] == nodes_[size_t(rank_)]) node_ranks_.push_back(r);
  welcome(rank_, addresses_);
}

int SocketCommunicator::sponsor_of(int newcomer) const {
  for (int r : node_ranks_)
    if (r != newcomer) return r;
  return -1;
}

void SocketCommunicator::admit(int rank) {
  const char* op = "SocketCommunicator::admit";
  PMOE_CHECK(rank >= 0 && rank < size_, op, " on rank ", rank_, ": rank ", rank, " is outside [0, ",
             size_, ")");
  PMOE_CHECK(rank != rank_, op, " on rank ", rank_, ": a rank cannot admit itself");
  PMOE_CHECK(device().kind == Device::Kind::cpu, op, " on rank ", rank_, ": a newcomer on ",
             device().str(), " is not built yet; the CPU only");
  PMOE_CHECK(nodes_[size_t(rank)] == nodes_[size_t(rank_)], op, " on rank ", rank_, ": rank ",
             rank, " is on node '", nodes_[size_t(rank)], "', this rank on '",
             nodes_[size_t(rank_)], "': the survivors of a newcomer's node hand it the lost "
             "rank's memory, and this one is not among them");
  PMOE_CHECK(sponsor_of(rank) >= 0, op, ": rank ", rank, " has no peer on its node");
  PMOE_CHECK(!transport_->connected(rank), op, " on rank ", rank_, ": rank ", rank,
             "'s connection is still open: its process lives (mask it and stop it before a new "
             "process takes its place)");
  transport_->accept_replacement(rank);
  const auto address_bytes = transport_->receive_message(rank, "SocketCommunicator::admit");
  std::vector<std::string> addresses = addresses_;
  addresses[size_t(rank)].assign(reinterpret_cast<const char*>(address_bytes.data()),
                                 address_bytes.size());
  welcome(rank, addresses);
}

void SocketCommunicator::welcome(int newcomer, const std::vector<std::string>& addresses) {
  const bool me = newcomer == rank_;
  const Welcome mine{job_digest(addresses), me ? 0 : allocations_, PeerWatch::self()};
  const auto gathered = all_gather(std::as_bytes(std::span(&mine, 1)));
  std::vector<Welcome> all(static_cast<size_t>(size_));
  std::memcpy(all.data(), gathered.data(), gathered.size());
  const int sponsor = sponsor_of(newcomer);
  for (int r = 0; r < size_; ++r) {
    PMOE_CHECK(all[size_t(r)].digest == mine.digest, me ? "SocketCommunicator::replacing"
               : "SocketCommunicator::admit", " on rank ", rank_, ": rank ", r, " was given "
               "other addresses (but for the newcomer's own), node names or job id than this rank, "
               "or runs on another kind of device; nothing changed on the survivors");
    PMOE_CHECK(r == newcomer || all[size_t(r)].allocations == all[size_t(sponsor)].allocations,
               "SocketCommunicator on rank ", rank_, ": the survivors made different numbers of "
               "allocations (", all[size_t(r)].allocations, " on rank ", r, ", ",
               all[size_t(sponsor)].allocations, " on rank ", sponsor, ")");
  }
  std::vector<PeerWatch::Identity> identities(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) identities[size_t(r)] = all[size_t(r)].identity;
  if (me) {
    allocations_ = all[size_t(sponsor)].allocations;
    group()->set_peer_watch(std::make_shared<PeerWatch>(rank_, node_ranks_, identities));
  } else {
    addresses_ = addresses;
    if (group()->peer_watch())
      group()->peer_watch()->rewatch(newcomer, identities[size_t(newcomer)], mine.identity);
  }
  detail::note_node_occupancy(*this, node_ranks_);

  // The channel for descriptors: the sponsor listens under a random name that only the newcomer
  // learns (over the mesh), and accepts only the newcomer's pid.
  const auto deadline = detail::FdClock::now() +
                        std::chrono::duration_cast<detail::FdClock::duration>(
                            std::chrono::duration<double>(timeout_s()));
  const std::string what = detail::cat("SocketCommunicator on rank ", rank_, ": the channel that "
                                       "hands rank ", newcomer, "'s memory over");
  std::string error;
  if (rank_ == sponsor) {
    error = detail::failure_of([&] {
      detail::FdListener listener = detail::listen_for_fds(detail::shm_prefix());
      transport_->send_message(newcomer, std::as_bytes(std::span(listener.name)));
      const int fd = detail::accept_fd_channel(listener, identities[size_t(newcomer)].pid,
                                               deadline, what);
      if (channels_.count(newcomer)) ::close(channels_[newcomer]);
      channels_[newcomer] = fd;
    });
  } else if (me) {
    error = detail::failure_of([&] {
      const auto name = transport_->receive_message(sponsor, "SocketCommunicator::replacing");
      channel_to_sponsor_ = detail::connect_fd_channel(
          std::string(reinterpret_cast<const char*>(name.data()), name.size()), deadline, what);
    });
  }
  detail::agree_on_step(*this, error, "admitting a newcomer (its descriptor channel)");
}

void SocketCommunicator::hand_over(SymmetricMemory& memory, int rank) {
  const char* op = "SocketCommunicator::hand_over";
  PMOE_CHECK(rank >= 0 && rank < size_ && rank != rank_, op, " on rank ", rank_, ": rank ", rank,
             " is not another rank of [0, ", size_, ")");
  const int sponsor = sponsor_of(rank);
  PMOE_CHECK(rank_ != sponsor || channels_.count(rank), op, " on rank ", rank_, ": rank ", rank,
             " was not admitted (SocketCommunicator::admit comes first)");
  const auto found = allocations_by_data_.find(memory.local());
  const auto regions = found == allocations_by_data_.end() ? nullptr : found->second.lock();
  PMOE_CHECK(regions && memory.device().kind == Device::Kind::cpu, op, " on rank ", rank_,
             ": the memory is not a live CPU allocation of this communicator");
  const detail::AllocationRequest request{memory.bytes(), uint64_t(memory.signal_slots()), rank,
                                          regions->serial};
  uint64_t serial = 0;
  detail::agreed_hand_over(rank_, all_gather(std::as_bytes(std::span(&request, 1))), request,
                           &serial);
  std::string error;
  if (rank_ == sponsor) {
    error = detail::failure_of([&] {
      std::vector<int> fds;  // in node_ranks_ order, as the newcomer maps them
      for (int r : node_ranks_) {
        const auto at = std::find(regions->segment_ranks.begin(), regions->segment_ranks.end(), r);
        PMOE_CHECK(at != regions->segment_ranks.end() &&
                       regions->segments[size_t(at - regions->segment_ranks.begin())].fd() >= 0,
                   op, " on rank ", rank_, ": no descriptor kept for rank ", r, "'s segment");
        fds.push_back(regions->segments[size_t(at - regions->segment_ranks.begin())].fd());
      }
      const auto deadline = detail::FdClock::now() +
                            std::chrono::duration_cast<detail::FdClock::duration>(
                                std::chrono::duration<double>(timeout_s()));
      detail::send_fds(channels_[rank], fds, serial, deadline,
                       detail::cat(op, " on rank ", rank_, " to rank ", rank));
    });
  }
  detail::agree_on_step(*this, error, "take over the lost rank's segments");
}

std::string SocketCommunicator::adopt_segments(detail::SocketRegions& regions,
                                               std::vector<std::byte*>& data, size_t total,
                                               uint64_t serial) {
  return detail::failure_of([&] {
    const std::string what = detail::cat("alloc_symmetric on rank ", rank_, " (taking over "
                                         "allocation ", serial, ")");
    PMOE_CHECK(channel_to_sponsor_ >= 0, what, ": this communicator was not made by replacing()");
    const auto deadline = detail::FdClock::now() +
                          std::chrono::duration_cast<detail::FdClock::duration>(
                              std::chrono::duration<double>(timeout_s()));
    std::vector<int> fds =
        detail::receive_fds(channel_to_sponsor_, node_ranks_.size(), serial, deadline, what);
    for (size_t i = 0; i < fds.size(); ++i) {
      try {
        regions.segments.push_back(detail::ShmSegment::adopt(fds[i], total, what));
      } catch (...) {
        for (size_t j = i + 1; j < fds.size(); ++j) ::close(fds[j]);
        throw;
      }
      regions.segment_ranks.push_back(node_ranks_[i]);
      data[size_t(node_ranks_[i])] = regions.segments.back().data();
    }
  });
}

}  // namespace pmoe
