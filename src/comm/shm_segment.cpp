#include "comm/shm_segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "pmoe/error.hpp"

namespace pmoe::detail {
namespace {

std::byte* map_fd(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
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
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    if (data_) munmap(data_, bytes_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
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
  segment.data_ = map_fd(fd, bytes, name);
  segment.bytes_ = bytes;
  return segment;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  PMOE_CHECK(fd >= 0, "shared memory '", name, "': shm_open failed: ", std::strerror(errno));
  ShmSegment segment;
  segment.data_ = map_fd(fd, bytes, name);
  segment.bytes_ = bytes;
  return segment;
}

void ShmSegment::unlink(const std::string& name) { shm_unlink(name.c_str()); }

}  // namespace pmoe::detail
