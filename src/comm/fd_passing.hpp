// File descriptors handed from one process of a node to another over a Unix-domain socket
// (SCM_RIGHTS): how the survivors give a process that takes a lost rank's place the shared-memory
// segments whose names were unlinked at set-up (SocketCommunicator::admit).
//
// Why not names: a segment's name is unlinked as soon as every node peer mapped it, so that a
// killed process leaves nothing in /dev/shm and nobody else can open it; the only way left into the
// memory is a descriptor that a process holding it passes on. The channel is an abstract-namespace
// socket (nothing on the file system to clean up) under 128 random bits, and the listener accepts
// only the process whose pid the newcomer announced over the job's own mesh (SO_PEERCRED), so no
// other process of the machine can take the descriptors.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pmoe::detail {

using FdClock = std::chrono::steady_clock;

// A listening abstract Unix socket under a random name; the name goes to the newcomer. Closed
// when it goes out of scope, so a failure between listening and accepting leaks nothing.
struct FdListener {
  int fd = -1;
  std::string name;  // without the leading NUL

  FdListener() = default;
  FdListener(FdListener&& other) noexcept
      : fd(std::exchange(other.fd, -1)), name(std::move(other.name)) {}
  FdListener& operator=(FdListener&&) = delete;
  ~FdListener() {
    if (fd >= 0) ::close(fd);
  }
};
FdListener listen_for_fds(const std::string& prefix);

// Accepts one connection on `listener` before `deadline` from process `pid` (its credentials as
// the kernel reports them); closes the listener either way. Throws pmoe::Error naming `what`.
int accept_fd_channel(FdListener& listener, int64_t pid, FdClock::time_point deadline,
                      const std::string& what);
// Connects to the listener called `name` before `deadline`.
int connect_fd_channel(const std::string& name, FdClock::time_point deadline,
                       const std::string& what);

// Sends `fds` (duplicated by the kernel into the receiver) with `tag`, which the receiver checks.
void send_fds(int channel, const std::vector<int>& fds, uint64_t tag, FdClock::time_point deadline,
              const std::string& what);
// Receives exactly `count` descriptors sent with `tag`; the caller owns them.
std::vector<int> receive_fds(int channel, size_t count, uint64_t tag, FdClock::time_point deadline,
                             const std::string& what);

}  // namespace pmoe::detail
