#include "comm/socket_transport.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "comm/wait.hpp"
#include "pmoe/comm.hpp"
#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? int(std::min<int64_t>(left.count(), 1 << 30)) : 0;
}

void set_stream_options(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // signals are tiny frames
}

// Reads or writes exactly `bytes` on a blocking-mode exchange during set-up, within the deadline.
void exchange_exactly(int fd, void* data, size_t bytes, bool write, Clock::time_point deadline,
                      const std::string& what) {
  auto* p = static_cast<std::byte*>(data);
  size_t done = 0;
  while (done < bytes) {
    pollfd pfd{fd, short(write ? POLLOUT : POLLIN), 0};
    const int ready = poll(&pfd, 1, remaining_ms(deadline));
    PMOE_CHECK(ready > 0, what, ": no answer before the timeout");
    const ssize_t n = write ? send(fd, p + done, bytes - done, MSG_NOSIGNAL)
                            : recv(fd, p + done, bytes - done, 0);
    PMOE_CHECK(n > 0, what, ": ", n == 0 ? "connection closed" : std::strerror(errno));
    done += size_t(n);
  }
}

int connect_to(const std::string& address, Clock::time_point deadline, const std::string& what) {
  const auto colon = address.rfind(':');
  PMOE_CHECK(colon != std::string::npos, what, ": address '", address, "' is not host:port");
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int status = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  PMOE_CHECK(status == 0, what, ": cannot resolve '", address, "': ", gai_strerror(status));
  std::string last_error;
  for (;;) {
    for (addrinfo* a = found; a; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        freeaddrinfo(found);
        return fd;
      }
      last_error = std::strerror(errno);
      ::close(fd);
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the peer may not listen yet
  }
  freeaddrinfo(found);
  throw Error(cat(what, ": cannot connect to ", address, ": ", last_error));
}

// Connects to `address` and announces `rank` on the new connection (the 4 bytes every acceptor
// reads first); its fd, or pmoe::Error naming `what` with nothing left open.
int connect_announcing(const std::string& address, int rank, Clock::time_point deadline,
                       const std::string& what) {
  const int fd = connect_to(address, deadline, what);
  int32_t me = rank;
  try {
    exchange_exactly(fd, &me, sizeof me, true, deadline, what);
  } catch (...) {
    ::close(fd);
    throw;
  }
  return fd;
}

}  // namespace

SocketTransport::SocketTransport(int listen_fd, int rank, std::vector<std::string> addresses,
                                 double timeout_s)
    : rank_(rank), timeout_s_(timeout_s), listen_fd_(listen_fd) {
  const int size = int(addresses.size());
  fds_.assign(size_t(size), -1);
  incoming_.resize(size_t(size));
  messages_.resize(size_t(size));
  const auto deadline = deadline_after(timeout_s);
  try {
    // Lower ranks listen before any address is exchanged, so connecting first and accepting
    // afterwards cannot deadlock: the kernel queues the connections until they are accepted.
    for (int r = 0; r < rank; ++r) {
      const std::string what = cat("SocketCommunicator on rank ", rank, ": connecting to rank ", r);
      fds_[size_t(r)] = connect_announcing(addresses[size_t(r)], rank, deadline, what);
    }
    for (int accepted = 0; accepted < size - 1 - rank; ++accepted) {
      const std::string what = cat("SocketCommunicator on rank ", rank, ": waiting for ",
                                   size - 1 - rank - accepted, " higher rank(s) to connect");
      pollfd pfd{listen_fd_, POLLIN, 0};
      PMOE_CHECK(poll(&pfd, 1, remaining_ms(deadline)) > 0, what, " within ", timeout_s, " s");
      const int fd = accept(listen_fd_, nullptr, nullptr);
      PMOE_CHECK(fd >= 0, what, ": accept failed: ", std::strerror(errno));
      int32_t peer = -1;
      try {
        exchange_exactly(fd, &peer, sizeof peer, false, deadline, what);
      } catch (...) {
        ::close(fd);
        throw;
      }
      if (peer <= rank || peer >= size || fds_[size_t(peer)] >= 0) {
        ::close(fd);
        throw Error(cat(what, ": a connection announced rank ", peer,
                        ", which is not a higher rank still expected (two jobs on one port?)"));
      }
      fds_[size_t(peer)] = fd;
    }
    for (int fd : fds_) {
      if (fd < 0) continue;
      set_stream_options(fd);
    }
  } catch (...) {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
    ::close(listen_fd_);
    throw;
  }
}

SocketTransport::SocketTransport(Replacing, int listen_fd, int rank,
                                 std::vector<std::string> addresses, double timeout_s)
    : rank_(rank), timeout_s_(timeout_s), listen_fd_(listen_fd) {
  const int size = int(addresses.size());
  fds_.assign(size_t(size), -1);
  incoming_.resize(size_t(size));
  messages_.resize(size_t(size));
  const auto deadline = deadline_after(timeout_s);
  try {
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const std::string what =
          cat("SocketCommunicator replacing rank ", rank, ": connecting to rank ", r);
      fds_[size_t(r)] = connect_announcing(addresses[size_t(r)], rank, deadline, what);
      set_stream_options(fds_[size_t(r)]);
    }
  } catch (...) {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
    ::close(listen_fd_);
    throw;
  }
}

bool SocketTransport::connected(int peer) {
  std::lock_guard lock(mutex_);
  progress();
  return fds_[size_t(peer)] >= 0;
}

void SocketTransport::accept_replacement(int peer) {
  std::lock_guard lock(mutex_);
  const std::string what =
      cat("SocketCommunicator::admit on rank ", rank_, ": waiting for rank ", peer, "'s newcomer");
  PMOE_CHECK(fds_[size_t(peer)] < 0, what, ": the connection of rank ", peer, " is still open");
  const auto deadline = deadline_after(timeout_s_);
  // Anything else that connects (a stray client, one that says nothing, a newcomer for another
  // rank) is closed and the wait goes on: one survivor must not fail an admission alone that the
  // others complete.
  int fd = -1;
  while (fd < 0) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    const int ready = poll(&pfd, 1, remaining_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    PMOE_CHECK(ready > 0, what, ": nobody connected within ", timeout_s_, " s");
    const int candidate = accept(listen_fd_, nullptr, nullptr);
    if (candidate < 0) {
      PMOE_CHECK(errno == EINTR || errno == EAGAIN || errno == ECONNABORTED, what,
                 ": accept failed: ", std::strerror(errno));
      continue;
    }
    int32_t announced = -1;
    try {  // a newcomer announces itself at once; a silent connection gets a few seconds
      exchange_exactly(candidate, &announced, sizeof announced, false,
                       std::min(deadline, deadline_after(5.0)), what);
    } catch (const Error&) {
      announced = -1;
    }
    if (announced == peer)
      fd = candidate;
    else
      ::close(candidate);
  }
  set_stream_options(fd);
  fds_[size_t(peer)] = fd;
  incoming_[size_t(peer)] = Incoming{};
  messages_[size_t(peer)].clear();
}

SocketTransport::~SocketTransport() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
  ::close(listen_fd_);
}

void SocketTransport::add_region(uint64_t serial, std::byte* base, uint64_t* signals) {
  std::lock_guard lock(mutex_);
  regions_[serial] = {base, signals};
}

void SocketTransport::remove_region(uint64_t serial) {
  std::lock_guard lock(mutex_);
  regions_.erase(serial);
}

void SocketTransport::put(int peer, uint64_t serial, size_t offset, const void* src, size_t bytes) {
  send_frame(peer, Header{kPut, serial, offset, bytes, 0, 0}, src);
}

void SocketTransport::signal(int peer, uint64_t serial, int slot, uint64_t value) {
  send_frame(peer, Header{kSignal, serial, 0, 0, uint64_t(slot), value}, nullptr);
}

void SocketTransport::send_message(int peer, std::span<const std::byte> bytes) {
  send_frame(peer, Header{kMessage, 0, 0, bytes.size(), 0, 0}, bytes.data());
}

std::vector<std::byte> SocketTransport::receive_message(int peer, const char* what) {
  auto& queue = messages_[size_t(peer)];
  // The lock is taken per poll, not across the wait: another thread of this rank may send.
  wait_until(
      timeout_s_,
      [&] {
        std::lock_guard lock(mutex_);
        return !queue.empty();
      },
      [&] {
        std::lock_guard lock(mutex_);
        progress();
        PMOE_CHECK(!queue.empty() || fds_[size_t(peer)] >= 0, what, " on rank ", rank_, ": rank ",
                   peer, " closed its connection (it failed or left)");
      },
      [&] {
        throw Error(cat(what, " on rank ", rank_, ": rank ", peer, " did not arrive within ",
                        timeout_s_, " s"));
      });
  std::lock_guard lock(mutex_);
  auto message = std::move(queue.front());
  queue.pop_front();
  return message;
}

void SocketTransport::send_frame(int peer, const Header& header, const void* payload) {
  std::lock_guard lock(mutex_);
  write_all(peer, reinterpret_cast<const std::byte*>(&header), sizeof header);
  write_all(peer, static_cast<const std::byte*>(payload), header.bytes);
}

void SocketTransport::write_all(int peer, const std::byte* data, size_t bytes) {
  const auto deadline = deadline_after(timeout_s_);
  size_t done = 0;
  while (done < bytes) {
    const int fd = fds_[size_t(peer)];
    PMOE_CHECK(fd >= 0, "socket transport on rank ", rank_, ": rank ", peer,
               " closed its connection (it failed or left)");
    const ssize_t n = send(fd, data + done, bytes - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    PMOE_CHECK(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR),
               "socket transport on rank ", rank_, ": sending to rank ", peer,
               " failed: ", std::strerror(errno));
    // The peer's buffer is full: take what peers send meanwhile (the peer may be blocked
    // sending to this rank), then wait briefly for room.
    progress();
    PMOE_CHECK(Clock::now() < deadline, "socket transport on rank ", rank_, ": rank ", peer,
               " took no data for ", timeout_s_, " s");
    pollfd pfd{fd, POLLOUT, 0};
    poll(&pfd, 1, 1);
  }
}

void SocketTransport::progress() {
  std::lock_guard lock(mutex_);
  for (int peer = 0; peer < int(fds_.size()); ++peer)
    if (fds_[size_t(peer)] >= 0)
      while (read_some(peer)) {
      }
}

bool SocketTransport::read_some(int peer) {
  Incoming& in = incoming_[size_t(peer)];
  const int fd = fds_[size_t(peer)];
  ssize_t n;
  if (in.header_done < sizeof in.header) {
    n = recv(fd, reinterpret_cast<std::byte*>(&in.header) + in.header_done,
             sizeof in.header - in.header_done, MSG_DONTWAIT);
    if (n > 0) {
      in.header_done += size_t(n);
      if (in.header_done == sizeof in.header) frame_header_done(peer);
      return true;
    }
  } else {
    const size_t left = in.header.bytes - in.payload_done;
    std::byte* into = in.into ? in.into + in.payload_done : discard_.data();
    n = recv(fd, into, in.into ? left : std::min(left, discard_.size()), MSG_DONTWAIT);
    if (n > 0) {
      in.payload_done += size_t(n);
      if (in.payload_done == in.header.bytes) frame_done(peer);
      return true;
    }
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  // Closed (n == 0) or reset: the peer left. What it sent before is already applied; a wait for
  // anything more from it runs into its timeout (or receive_message's check).
  ::close(fd);
  fds_[size_t(peer)] = -1;
  return false;
}

void SocketTransport::frame_header_done(int peer) {
  Incoming& in = incoming_[size_t(peer)];
  in.payload_done = 0;
  in.into = nullptr;
  if (in.header.kind == kMessage) {
    in.message.assign(in.header.bytes, std::byte{0});
    in.into = in.message.data();
  } else if (in.header.kind == kPut) {
    const auto region = regions_.find(in.header.serial);
    if (region != regions_.end()) {
      in.into = region->second.base + in.header.offset;
    } else {
      discard_.resize(1 << 20);
    }
  }
  if (in.header.bytes == 0) frame_done(peer);
}

void SocketTransport::frame_done(int peer) {
  Incoming& in = incoming_[size_t(peer)];
  if (in.header.kind == kSignal) {
    const auto region = regions_.find(in.header.serial);
    if (region != regions_.end())
      std::atomic_ref<uint64_t>(
          region->second
              .signals[in.header.slot * (SymmetricMemory::kSignalBytes / sizeof(uint64_t))])
          .store(in.header.value, std::memory_order_release);
  } else if (in.header.kind == kMessage) {
    messages_[size_t(peer)].push_back(std::move(in.message));
    in.message = {};
  }
  in.header_done = 0;
  in.payload_done = 0;
  in.into = nullptr;
}

}  // namespace pmoe::detail
