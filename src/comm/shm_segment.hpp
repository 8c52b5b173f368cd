// A POSIX shared-memory segment mapped into this process: how MPI ranks on one node share
// symmetric memory. Segments are created 0600 (only this user) under names with 128 random bits
// (nobody can create or open one first); the creator unlinks the name once every peer has mapped
// it, so nothing is left in /dev/shm after set-up, not even when a process is killed later, and
// unmapping is local (no collective teardown that could hang on a rank that left).
#pragma once

#include <cstddef>
#include <string>

namespace pmoe::detail {

// The first part of every segment name: PMOE_SHM_PREFIX if set (letters, digits, '-', '_', at
// most 64), else "pmoe". Tests set it to tell their segments from other jobs'.
std::string shm_prefix();

class ShmSegment {
 public:
  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;

  // Creates `name` with `bytes` zeroed bytes and maps it; throws pmoe::Error with errno's text.
  // keep_fd: the segment keeps its file descriptor, so that the memory can later be handed to a
  // process that takes a lost rank's place once the name is gone (SocketCommunicator::admit).
  static ShmSegment create(const std::string& name, size_t bytes, bool keep_fd = false);
  // Maps an existing segment created by a peer.
  static ShmSegment open(const std::string& name, size_t bytes, bool keep_fd = false);
  // Maps the segment behind `fd` (received from a peer; taken over, kept as with keep_fd). Throws
  // if it holds fewer than `bytes` bytes; `what` names it in errors.
  static ShmSegment adopt(int fd, size_t bytes, const std::string& what);
  // Removes the name; mappings stay valid. Errors are ignored (the name may be gone already).
  static void unlink(const std::string& name);

  std::byte* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // The kept file descriptor, or -1.
  int fd() const { return fd_; }

 private:
  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
};

}  // namespace pmoe::detail
