#include "index_plane/arena_mapping.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvstrand::index_plane {

common::Expected<std::unique_ptr<ArenaMapping>> ArenaMapping::map(int fd, std::uint64_t bytes,
                                                                  std::uint64_t slab_bytes, uid_t server_uid,
                                                                  bool read_only) {
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }  // the mapping keeps the file alive
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != bytes) {
    return common::unexpected("the arena's size is not the " + std::to_string(bytes) + " B the server announced");
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  const bool sealed = seals >= 0 && (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) == (F_SEAL_SHRINK | F_SEAL_GROW);
  // The server's user may resize the file, but is trusted already (it
  // could serve anything as hits); a third user could not open it.
  const bool named = S_ISREG(st.st_mode) && (st.st_uid == ::geteuid() || st.st_uid == server_uid) &&
                     (st.st_mode & 077) == 0;
  if (!sealed && !named) {
    return common::unexpected("the arena is not sealed against resize, nor a file of this user or the server's that "
                              "no one else may open");
  }
  if (slab_bytes == 0 || bytes % slab_bytes != 0) {
    return common::unexpected("the arena is not a whole number of slabs");
  }
  void* p = ::mmap(nullptr, bytes, read_only ? PROT_READ : PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return common::unexpected(std::string("mmap: ") + std::strerror(errno));
  }
  std::unique_ptr<ArenaMapping> m(new ArenaMapping);
  m->base_ = static_cast<std::byte*>(p);
  m->bytes_ = bytes;
  m->slab_bytes_ = slab_bytes;
  m->read_only_ = read_only;
  m->dev_ = static_cast<std::uint64_t>(st.st_dev);
  m->ino_ = static_cast<std::uint64_t>(st.st_ino);
  m->slabs_.resize(bytes / slab_bytes);
  return m;
}

bool ArenaMapping::is_file(int fd) const noexcept {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_dev) == dev_ &&
         static_cast<std::uint64_t>(st.st_ino) == ino_ && static_cast<std::uint64_t>(st.st_size) == bytes_;
}

ArenaMapping::~ArenaMapping() {
  slabs_.clear();  // unpinned before the memory goes
  if (base_) ::munmap(base_, bytes_);
}

}  // namespace kvstrand::index_plane
