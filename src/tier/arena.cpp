#include "tier/arena.hpp"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace kvstrand::tier {

namespace {
constexpr std::uint64_t kHugePage = 2ull << 20;

std::string errno_text(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

// A sealable memfd of `bytes`, or -1 (errno set).
int make_file(std::uint64_t bytes, bool huge) {
  const unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB : 0u);
  const int fd = ::memfd_create("kvstrand-arena", flags);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}
}  // namespace

Arena::Arena(ArenaOptions o) {
  if (o.slab_bytes == 0 || o.slab_bytes % kHugePage != 0)
    throw std::runtime_error("slab size " + std::to_string(o.slab_bytes) + " is not a multiple of 2 MiB");
  slab_bytes_ = o.slab_bytes;
  bytes_ = (o.bytes + slab_bytes_ - 1) / slab_bytes_ * slab_bytes_;
  if (bytes_ == 0) throw std::runtime_error("an arena needs at least one slab");
  if (o.try_huge_pages) {
    // Huge pages only where one can really be had now: a memfd on hugetlbfs
    // is created even with none reserved, and would fail at the first slab.
    fd_ = make_file(bytes_, true);
    if (fd_ >= 0 && ::fallocate(fd_, 0, 0, static_cast<off_t>(kHugePage)) == 0) {
      huge_ = true;
    } else if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  if (fd_ < 0) fd_ = make_file(bytes_, false);
  if (fd_ < 0) throw std::runtime_error(errno_text("memfd_create/ftruncate"));
  if (::fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const std::string why = errno_text("fcntl(F_ADD_SEALS)");
    ::close(fd_);
    throw std::runtime_error(why);
  }
}

Arena::~Arena() {
  if (fd_ >= 0) ::close(fd_);
}

std::string Arena::populate(std::uint32_t slab) const {
  if (slab >= slab_count()) return "no slab " + std::to_string(slab);
  const auto off = static_cast<off_t>(static_cast<std::uint64_t>(slab) * slab_bytes_);
  if (::fallocate(fd_, 0, off, static_cast<off_t>(slab_bytes_)) != 0) return errno_text("fallocate");
  return {};
}

std::uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

}  // namespace kvstrand::tier
