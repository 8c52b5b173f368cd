#include "comm/shm_segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

std::byte* map_fd(int fd, size_t bytes, const std::string& name, bool keep_fd) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  if (!keep_fd || p == MAP_FAILED) ::close(fd);
  PMOE_CHECK(p != MAP_FAILED, "shared memory '", name, "': mmap of ", bytes,
             " bytes failed: ", std::strerror(err));
  return static_cast<std::byte*>(p);
}

}  // namespace

std::string shm_prefix() {
  const char* text = std::getenv("PMOE_SHM_PREFIX");
  if (!text || !*text) return "pmoe";
  const std::string prefix = text;
  bool ok = prefix.size() <= 64;
  for (char c : prefix) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_');
  PMOE_CHECK(ok, "PMOE_SHM_PREFIX must be 1 to 64 letters, digits, '-' or '_', got '", prefix, "'");
  return prefix;
}

ShmSegment::~ShmSegment() {
  if (data_) munmap(data_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      fd_(std::exchange(other.fd_, -1)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    if (data_) munmap(data_, bytes_);
    if (fd_ >= 0) ::close(fd_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

ShmSegment ShmSegment::create(const std::string& name, size_t bytes, bool keep_fd) {
  // O_EXCL: a name that exists already (someone else's) is an error, never reused.
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  PMOE_CHECK(fd >= 0, "shared memory '", name, "': shm_open(create) failed: ",
             std::strerror(errno));
  if (ftruncate(fd, off_t(bytes)) != 0) {  // the new pages read as zero
    const int err = errno;
    ::close(fd);
    shm_unlink(name.c_str());
    throw Error(cat("shared memory '", name, "': ftruncate to ", bytes, " bytes failed: ",
                    std::strerror(err), " (is /dev/shm large enough?)"));
  }
  ShmSegment segment;
  segment.data_ = map_fd(fd, bytes, name, keep_fd);
  segment.bytes_ = bytes;
  segment.fd_ = keep_fd ? fd : -1;
  return segment;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes, bool keep_fd) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  PMOE_CHECK(fd >= 0, "shared memory '", name, "': shm_open failed: ", std::strerror(errno));
  ShmSegment segment;
  segment.data_ = map_fd(fd, bytes, name, keep_fd);
  segment.bytes_ = bytes;
  segment.fd_ = keep_fd ? fd : -1;
  return segment;
}

ShmSegment ShmSegment::adopt(int fd, size_t bytes, const std::string& what) {
  struct stat st = {};
  const bool read = fstat(fd, &st) == 0;
  const int err = errno;
  if (!read || size_t(st.st_size) < bytes) {
    ::close(fd);
    throw Error(read ? cat(what, ": the segment handed over holds ", st.st_size,
                           " bytes, fewer than the ", bytes, " expected")
                     : cat(what, ": fstat of the segment handed over failed: ",
                           std::strerror(err)));
  }
  ShmSegment segment;
  segment.data_ = map_fd(fd, bytes, what, true);
  segment.bytes_ = bytes;
  segment.fd_ = fd;
  return segment;
}

void ShmSegment::unlink(const std::string& name) { shm_unlink(name.c_str()); }

}  // namespace pmoe::detail
