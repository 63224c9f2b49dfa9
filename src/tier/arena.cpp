#include "tier/arena.hpp"

#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <utility>

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
// The named arena at `path`: opened when it is there (reopened = true when
// its size is `bytes`; another size is made again), created otherwise.
int open_named(const std::string& path, std::uint64_t bytes, bool* reopened, bool* huge) {
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) throw std::runtime_error(errno_text(("statfs " + dir).c_str()));
  if (fs.f_type != TMPFS_MAGIC && fs.f_type != HUGETLBFS_MAGIC)
    throw std::runtime_error(dir + " is not tmpfs or hugetlbfs (an arena on a disk file system would be written back "
                                   "to the disk): use /dev/shm or a hugetlbfs mount");
  *huge = fs.f_type == HUGETLBFS_MAGIC;
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
      ::close(fd);
      throw std::runtime_error(path + " is not a regular file of this user with mode 0600 (another user's, or "
                                      "readable by others): remove it or choose another path");
    }
    if (static_cast<std::uint64_t>(st.st_size) == bytes) {
      *reopened = true;
      return fd;
    }
    ::close(fd);
    if (::unlink(path.c_str()) != 0) throw std::runtime_error(errno_text(("unlink " + path).c_str()));
  } else if (errno != ENOENT) {
    throw std::runtime_error(errno_text(("open " + path).c_str()));
  }
  fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_CREAT | O_EXCL, 0600);
  if (fd < 0) throw std::runtime_error(errno_text(("create " + path).c_str()));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const std::string why = errno_text("ftruncate");
    ::close(fd);
    ::unlink(path.c_str());
    throw std::runtime_error(why);
  }
  return fd;
}

}  // namespace

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

void Arena::map_in(std::byte* p, std::uint64_t n) {
  (void)::madvise(p, n, MADV_POPULATE_READ);  // Linux 5.14 or later; the reads below do it anyway
#if defined(__SANITIZE_THREAD__)
  __tsan_ignore_thread_begin();
#endif
  for (std::uint64_t at = 0; at < n; at += 4096) (void)*static_cast<volatile std::byte*>(p + at);
#if defined(__SANITIZE_THREAD__)
  __tsan_ignore_thread_end();
#endif
}

Arena::Arena(ArenaOptions o) {
  if (o.slab_bytes == 0 || o.slab_bytes % kHugePage != 0)
    throw std::runtime_error("slab size " + std::to_string(o.slab_bytes) + " is not a multiple of 2 MiB");
  slab_bytes_ = o.slab_bytes;
  bytes_ = (o.bytes + slab_bytes_ - 1) / slab_bytes_ * slab_bytes_;
  if (bytes_ == 0) throw std::runtime_error("an arena needs at least one slab");
  if (!o.path.empty()) {
    path_ = o.path;
    // One server per named arena: two would write its tables at once. The
    // lock is on a file of the server's own, not on the arena: clients map
    // the arena's open file, and their mappings would keep a lock on it
    // past the server's death.
    const std::string lock = path_ + ".lock";
    // Checked as the arena is: this user's own regular file. One another
    // user made first (in /dev/shm anyone may) could be held locked by
    // them, or not be openable at all: refused, saying whose it is.
    struct stat before {};
    if (::lstat(lock.c_str(), &before) == 0 && (!S_ISREG(before.st_mode) || before.st_uid != ::geteuid()))
      throw std::runtime_error(lock + " is " + (S_ISREG(before.st_mode) ? "" : "not a regular file, and ") +
                               "owned by uid " + std::to_string(before.st_uid) + ", not this server's user (uid " +
                               std::to_string(::geteuid()) +
                               "): it is not this server's lock; remove it, or choose another path");
    lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_CREAT, 0600);
    if (lock_fd_ < 0) throw std::runtime_error(errno_text(("open " + lock).c_str()));
    struct stat st {};
    if (::fstat(lock_fd_, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
      ::close(std::exchange(lock_fd_, -1));
      throw std::runtime_error(lock + " changed owner while it was opened: not this server's lock");
    }
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(std::exchange(lock_fd_, -1));
      throw std::runtime_error("another kvstrand-server uses " + path_ + " (" + lock + " is locked)");
    }
    try {
      fd_ = open_named(path_, bytes_, &reopened_, &huge_);
    } catch (...) {
      ::close(std::exchange(lock_fd_, -1));
      throw;
    }
    return;
  }
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
  if (fd_ >= 0) ::close(fd_);  // a named arena's file stays: it is what the next server finds
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void Arena::start_empty() {
  if (path_.empty()) return;
  ::close(std::exchange(fd_, -1));
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) throw std::runtime_error(errno_text(("unlink " + path_).c_str()));
  reopened_ = false;
  fd_ = open_named(path_, bytes_, &reopened_, &huge_);
}

std::string Arena::populate(std::uint32_t slab) const {
  if (slab >= slab_count()) return "no slab " + std::to_string(slab);
  const auto off = static_cast<off_t>(static_cast<std::uint64_t>(slab) * slab_bytes_);
  if (::fallocate(fd_, 0, off, static_cast<off_t>(slab_bytes_)) != 0) return errno_text("fallocate");
  return {};
}

std::uint64_t held_by_named_arena(const std::string& path, std::uint64_t bytes) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<std::uint64_t>(st.st_size) != bytes)
    return 0;
  return static_cast<std::uint64_t>(st.st_blocks) * 512;
}

std::uint64_t available_memory_bytes() {
  // Tests of the check against it set what the machine has (in MiB).
  if (const char* test = std::getenv("KVSTRAND_TEST_MEM_AVAILABLE_MIB")) return std::strtoull(test, nullptr, 10) << 20;
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

}  // namespace kvstrand::tier
