#include "comm/fd_passing.hpp"

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

// Linux's limit on descriptors in one SCM_RIGHTS message.
constexpr size_t kMostFds = 253;

int remaining_ms(FdClock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - FdClock::now()).count();
  return left > 0 ? int(std::min<int64_t>(left, 1 << 30)) : 0;
}

sockaddr_un abstract_address(const std::string& name, socklen_t& length) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  PMOE_CHECK(name.size() + 1 < sizeof address.sun_path, "fd channel: name too long");
  address.sun_path[0] = '\0';  // abstract: no file to create or remove
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  length = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return address;
}

void wait_ready(int fd, short events, FdClock::time_point deadline, const std::string& what) {
  for (;;) {
    pollfd entry{fd, events, 0};
    const int ready = poll(&entry, 1, remaining_ms(deadline));
    if (ready > 0) return;
    PMOE_CHECK(ready < 0 && errno == EINTR, what, ": no answer before the timeout");
  }
}

}  // namespace

FdListener listen_for_fds(const std::string& prefix) {
  uint8_t random[16];
  PMOE_CHECK(getrandom(random, sizeof random, 0) == ssize_t(sizeof random),
             "fd channel: getrandom failed: ", std::strerror(errno));
  FdListener listener;
  listener.name = prefix + ".admit.";
  for (uint8_t b : random) listener.name += cat(char('a' + (b >> 4)), char('a' + (b & 15)));
  listener.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  PMOE_CHECK(listener.fd >= 0, "fd channel: socket failed: ", std::strerror(errno));
  socklen_t length = 0;
  const sockaddr_un address = abstract_address(listener.name, length);
  if (bind(listener.fd, reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
      listen(listener.fd, 1) != 0) {
    throw Error(cat("fd channel: cannot listen on a Unix socket: ", std::strerror(errno)));
  }
  return listener;
}

int accept_fd_channel(FdListener& listener, int64_t pid, FdClock::time_point deadline,
                      const std::string& what) {
  struct CloseListener {
    FdListener& l;
    ~CloseListener() {
      if (l.fd >= 0) ::close(l.fd);
      l.fd = -1;
    }
  } close_listener{listener};
  for (;;) {
    wait_ready(listener.fd, POLLIN, deadline, what);
    const int fd = accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC);
    PMOE_CHECK(fd >= 0 || errno == EINTR || errno == EAGAIN, what, ": accept failed: ",
               std::strerror(errno));
    if (fd < 0) continue;
    ucred credentials{};
    socklen_t length = sizeof credentials;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0 &&
        int64_t(credentials.pid) == pid && credentials.uid == getuid())
      return fd;
    ::close(fd);  // another process found the name: refuse it, keep waiting for the newcomer
  }
}

int connect_fd_channel(const std::string& name, FdClock::time_point deadline,
                       const std::string& what) {
  socklen_t length = 0;
  const sockaddr_un address = abstract_address(name, length);
  std::string error;
  do {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    PMOE_CHECK(fd >= 0, what, ": socket failed: ", std::strerror(errno));
    if (connect(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) return fd;
    error = std::strerror(errno);
    ::close(fd);
    usleep(10000);
  } while (FdClock::now() < deadline);
  throw Error(cat(what, ": cannot connect to the survivor's Unix socket: ", error));
}

void send_fds(int channel, const std::vector<int>& fds, uint64_t tag, FdClock::time_point deadline,
              const std::string& what) {
  PMOE_CHECK(fds.size() <= kMostFds, what, ": ", fds.size(), " descriptors, more than the ",
             kMostFds, " one message carries");
  std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(fds.size(), 1)));
  iovec payload{&tag, sizeof tag};
  msghdr message{};
  message.msg_iov = &payload;
  message.msg_iovlen = 1;
  if (!fds.empty()) {
    message.msg_control = control.data();
    message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    wait_ready(channel, POLLOUT, deadline, what);
    const ssize_t n = sendmsg(channel, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == ssize_t(sizeof tag)) return;
    PMOE_CHECK(n < 0 && (errno == EINTR || errno == EAGAIN), what, ": sendmsg failed: ",
               n < 0 ? std::strerror(errno) : "short write");
  }
}

std::vector<int> receive_fds(int channel, size_t count, uint64_t tag, FdClock::time_point deadline,
                             const std::string& what) {
  PMOE_CHECK(count <= kMostFds, what, ": ", count, " descriptors, more than one message carries");
  std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(count, 1)));
  uint64_t got_tag = 0;
  iovec payload{&got_tag, sizeof got_tag};
  msghdr message{};
  message.msg_iov = &payload;
  message.msg_iovlen = 1;
  message.msg_control = control.data();
  message.msg_controllen = control.size();
  ssize_t n;
  for (;;) {
    wait_ready(channel, POLLIN, deadline, what);
    n = recvmsg(channel, &message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n >= 0 || (errno != EINTR && errno != EAGAIN)) break;
  }
  std::vector<int> fds;
  for (cmsghdr* h = CMSG_FIRSTHDR(&message); h; h = CMSG_NXTHDR(&message, h))
    if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
      const size_t in = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const size_t at = fds.size();
      fds.resize(at + in);
      std::memcpy(fds.data() + at, CMSG_DATA(h), in * sizeof(int));
    }
  const bool whole = n == ssize_t(sizeof got_tag) && got_tag == tag && fds.size() == count &&
                     !(message.msg_flags & MSG_CTRUNC);
  if (!whole) {
    for (int fd : fds) ::close(fd);
    throw Error(cat(what, ": ", n < 0 ? cat("recvmsg failed: ", std::strerror(errno))
                                : n == 0 ? std::string("the survivor closed the channel")
                                         : cat("expected ", count, " descriptors for allocation ",
                                               tag, ", got ", fds.size(), " for ", got_tag)));
  }
  return fds;
}

}  // namespace pmoe::detail
