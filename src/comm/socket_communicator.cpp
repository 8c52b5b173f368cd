// SocketCommunicator: set-up collectives as messages over the TCP mesh; symmetric memory through
// POSIX shared memory on the node and TCP frames off it, or, on a CUDA device, device memory
// shared with the node's processes through CUDA IPC.
#include "pmoe/socket_communicator.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <netdb.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>

#include "comm/agree_on_step.hpp"
#include "comm/device_segments.hpp"
#include "comm/group.hpp"
#include "comm/node_segments.hpp"
#include "comm/routed_memory.hpp"
#include "comm/shm_segment.hpp"
#include "comm/node_occupancy.hpp"
#include "comm/peer_watch.hpp"
#include "comm/socket_regions.hpp"
#include "comm/socket_transport.hpp"
#include "core/device_runtime.hpp"
#include "pmoe/error.hpp"

namespace pmoe {
namespace {

using detail::SocketRegions;

using SocketSymmetricMemory = detail::RoutedSymmetricMemory<detail::SocketTransport, SocketRegions>;

// FNV-1a over the strings and their lengths: a digest that ranks compare to agree on set-up.
uint64_t digest(const std::vector<std::string>& parts) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i)
      h = (h ^ static_cast<const unsigned char*>(p)[i]) * 1099511628211ull;
  };
  for (const auto& s : parts) {
    const uint64_t n = s.size();
    mix(&n, sizeof n);
    mix(s.data(), s.size());
  }
  return h;
}

}  // namespace

SocketCommunicator::Listener::Listener(const std::string& bind_host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int status = getaddrinfo(bind_host.c_str(), "0", &hints, &found);
  PMOE_CHECK(status == 0, "SocketCommunicator: cannot resolve bind address '", bind_host,
             "': ", gai_strerror(status));
  std::string error = "no address";
  for (addrinfo* a = found; a && fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
      sockaddr_storage bound{};
      socklen_t length = sizeof bound;
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
      port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      fd_ = fd;
    } else {
      error = std::strerror(errno);
      ::close(fd);
    }
  }
  freeaddrinfo(found);
  PMOE_CHECK(fd_ >= 0, "SocketCommunicator: cannot listen on '", bind_host, "': ", error);
}

SocketCommunicator::Listener::~Listener() {
  if (fd_ >= 0) ::close(fd_);
}

SocketCommunicator::Listener::Listener(Listener&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}

SocketCommunicator::SocketCommunicator(Listener&& listener, int rank,
                                       std::vector<std::string> addresses,
                                       std::vector<std::string> nodes, std::string job_id,
                                       Device device)
    : Communicator(std::make_shared<detail::Group>(), device),
      rank_(rank),
      size_(int(addresses.size())),
      job_id_(std::move(job_id)) {
  PMOE_CHECK(listener.fd_ >= 0, "SocketCommunicator: the listener was already used");
  PMOE_CHECK(size_ >= 1 && rank >= 0 && rank < size_, "SocketCommunicator: rank ", rank,
             " outside [0, ", size_, ")");
  PMOE_CHECK(nodes.size() == addresses.size(), "SocketCommunicator: ", addresses.size(),
             " addresses but ", nodes.size(), " node names");
  PMOE_CHECK(!job_id_.empty() && job_id_.find('/') == std::string::npos,
             "SocketCommunicator: job_id must be non-empty and free of '/', got '", job_id_, "'");
  transport_ = std::make_shared<detail::SocketTransport>(std::exchange(listener.fd_, -1), rank,
                                                         addresses, timeout_s());

  addresses_ = std::move(addresses);
  nodes_ = std::move(nodes);
  // Every rank must have been given the same picture of the job, and run on the same kind of
  // device (each process its own GPU, so the index may differ).
  const uint64_t mine = job_digest(addresses_);
  const auto all = all_gather(std::as_bytes(std::span(&mine, 1)));
  for (int r = 0; r < size_; ++r) {
    uint64_t theirs;
    std::memcpy(&theirs, all.data() + size_t(r) * sizeof theirs, sizeof theirs);
    PMOE_CHECK(theirs == mine, "SocketCommunicator on rank ", rank_, ": rank ", r,
               " was given other addresses, node names or job id than this rank, or runs on "
               "another kind of device (this rank: ", device.str(), ")");
  }
  for (int r = 0; r < size_; ++r)
    if (nodes_[size_t(r)] == nodes_[size_t(rank_)]) node_ranks_.push_back(r);
  // Waits block early where this node's ranks outnumber its CPUs (torchrun's 4 ranks on 2 cores).
  detail::note_node_occupancy(*this, node_ranks_);
  // Node-local peers are watched, as MPI's are: a dead one fails a wait at once, or is masked
  // within about 20 ms by an op made with on_peer_loss = mask.
  const auto self = detail::PeerWatch::self();
  const auto identities_bytes = all_gather(std::as_bytes(std::span(&self, 1)));
  std::vector<detail::PeerWatch::Identity> identities(static_cast<size_t>(size_));
  std::memcpy(identities.data(), identities_bytes.data(), identities_bytes.size());
  group()->set_peer_watch(std::make_shared<detail::PeerWatch>(rank_, node_ranks_, identities));
  if (device.kind == Device::Kind::cuda) {
    // Every rank learns whether every rank has its stream, so none waits for a failed one.
    detail::agree_on_step(
        *this, [&] { set_stream(detail::create_stream(device)); },
        detail::cat("SocketCommunicator on ", device.str(), " (its stream)"));
  }
}

SocketCommunicator::~SocketCommunicator() {
  for (const auto& [newcomer, fd] : channels_) ::close(fd);
  if (channel_to_sponsor_ >= 0) ::close(channel_to_sponsor_);
  detail::destroy_stream(stream());
}

uint64_t SocketCommunicator::job_digest(const std::vector<std::string>& addresses) const {
  std::vector<std::string> parts = addresses;
  parts.insert(parts.end(), nodes_.begin(), nodes_.end());
  parts.push_back(job_id_);
  parts.push_back(device().kind == Device::Kind::cuda ? "cuda" : "cpu");
  return digest(parts);
}

std::vector<std::byte> SocketCommunicator::all_gather(std::span<const std::byte> mine) {
  std::vector<std::byte> all(mine.size() * size_t(size_));
  std::copy(mine.begin(), mine.end(), all.begin() + ptrdiff_t(mine.size() * size_t(rank_)));
  for (int r = 0; r < size_; ++r)
    if (r != rank_) transport_->send_message(r, mine);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const auto theirs = transport_->receive_message(r, "all_gather");
    PMOE_CHECK(theirs.size() == mine.size(), "all_gather on rank ", rank_, ": rank ", r, " sent ",
               theirs.size(), " bytes, this rank ", mine.size(), " (ranks out of step)");
    std::copy(theirs.begin(), theirs.end(), all.begin() + ptrdiff_t(mine.size() * size_t(r)));
  }
  return all;
}

void SocketCommunicator::barrier() { all_gather({}); }

void SocketCommunicator::broadcast(std::span<std::byte> data, int root) {
  PMOE_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " outside [0, ", size_, ")");
  if (rank_ == root) {
    for (int r = 0; r < size_; ++r)
      if (r != rank_) transport_->send_message(r, data);
    return;
  }
  const auto theirs = transport_->receive_message(root, "broadcast");
  PMOE_CHECK(theirs.size() == data.size(), "broadcast on rank ", rank_, ": root ", root, " sent ",
             theirs.size(), " bytes, this rank expected ", data.size());
  std::copy(theirs.begin(), theirs.end(), data.begin());
}

std::unique_ptr<SymmetricMemory> SocketCommunicator::alloc_symmetric(size_t bytes,
                                                                     int signal_slots) {
  return alloc_symmetric_in(device(), bytes, signal_slots);
}

std::unique_ptr<SymmetricMemory> SocketCommunicator::alloc_host_symmetric(size_t bytes) {
  return alloc_symmetric_in(Device::cpu(), bytes, 0);
}

std::unique_ptr<SymmetricMemory> SocketCommunicator::alloc_symmetric_in(Device where,
                                                                        size_t bytes,
                                                                        int signal_slots) {
  PMOE_CHECK(signal_slots >= 0, "alloc_symmetric: negative signal count ", signal_slots);
  const size_t data_bytes = (bytes + 63) / 64 * 64;
  const size_t total = data_bytes + size_t(signal_slots) * SymmetricMemory::kSignalBytes;
  // Ranks that disagree on an op's config (and so on its sizes) fail here, on every rank; a
  // newcomer takes over the allocation the survivors hand it (socket_admission.cpp).
  const detail::AllocationRequest request{bytes, uint64_t(signal_slots), -1, 0};
  uint64_t handed_serial = 0;
  const int handed_to = detail::agreed_hand_over(
      rank_, all_gather(std::as_bytes(std::span(&request, 1))), request, &handed_serial);
  const uint64_t serial = handed_to == rank_ ? handed_serial : allocations_++;
  auto name_of = [&](int r) {
    return detail::cat("/", detail::shm_prefix(), ".torch.", job_id_, ".", serial, ".", r);
  };

  auto agree = [&](const std::string& my_error, const char* step) {
    detail::agree_on_step(*this, my_error, detail::cat("alloc_symmetric (", step, ")"));
  };

  auto regions = std::make_shared<SocketRegions>();
  std::vector<std::byte*> data(size_t(size_), nullptr);
  std::vector<uint64_t*> signals(size_t(size_), nullptr);
  // Registered before the last exchange: a peer puts only after that exchange, so its frames
  // never find this region missing.
  auto register_region = [&] {
    for (int r = 0; r < size_; ++r)
      if (data[size_t(r)])
        signals[size_t(r)] = reinterpret_cast<uint64_t*>(data[size_t(r)] + data_bytes);
    regions->transport = transport_;
    regions->serial = serial;
    transport_->add_region(serial, data[size_t(rank_)], signals[size_t(rank_)]);
  };
  if (where.kind == Device::Kind::cuda) {
    // Kernels load and store node peers' device memory; nothing arrives as a TCP frame.
    detail::map_device_segments(regions->device_segments, data, total, *this, node_ranks_, agree);
    for (int r = 0; r < size_; ++r)
      if (data[size_t(r)])
        signals[size_t(r)] = reinterpret_cast<uint64_t*>(data[size_t(r)] + data_bytes);
    regions->transport = transport_;  // held, never registered with: no frame lands on a GPU
    regions->serial = serial;
  } else {
    if (handed_to == rank_) {
      const std::string error = adopt_segments(*regions, data, total, serial);
      if (error.empty()) register_region();
      agree(error, "take over the lost rank's segments");
    } else {
      // Each segment keeps its descriptor, for a newcomer in a lost rank's place (hand_over).
      detail::map_node_segments(regions->segments, data, total, rank_, node_ranks_, name_of,
                                agree, register_region, /*keep_fds=*/true);
      regions->segment_ranks.push_back(rank_);
      for (int r : node_ranks_)
        if (r != rank_) regions->segment_ranks.push_back(r);
    }
    std::erase_if(allocations_by_data_, [](const auto& entry) { return entry.second.expired(); });
    allocations_by_data_[data[size_t(rank_)]] = regions;
  }
  return std::make_unique<SocketSymmetricMemory>(rank_, bytes, signal_slots, std::move(data),
                                                 std::move(signals), regions, group(), timeout_s(),
                                                 where);
}

}  // namespace pmoe
