// The node tier's bytes: one shared-memory file (memfd) that kvstrand-server
// creates and hands to every client over its socket (SCM_RIGHTS). Each
// client maps it and pins it for its own device; the server maps it only
// with --l2, to move objects to and from Redis.
//
// - Sealed against resize (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): no
//   client can shrink it under another's mapping (a SIGBUS in a peer) or
//   grow it.
// - Huge pages where the system has them reserved (MFD_HUGETLB, probed with
//   one page at start), plain shared memory otherwise.
// - Or, with a path (kvstrand-server --arena-path), a named file on tmpfs or
//   hugetlbfs that outlives the server: the next server opens it again and
//   finds its objects (ObjectTable). What that gives up against the memfd:
//   the seals (tmpfs files cannot be sealed, so a process of the same user
//   could shrink it under a peer's mapping); kept: huge pages (on
//   hugetlbfs), and the permissions (one user, mode 0600, checked at start
//   by the server and again by each client on the descriptor it is sent).
// - It grows in slabs: populate(i) allocates slab i's pages (fallocate),
//   which takes about half a second a GiB, so the owner calls it off its
//   strand and adds the slab's slots to the Index when it returns. An object
//   never straddles two slabs.
#pragma once

#include <cstdint>
#include <string>

namespace kvstrand::tier {

struct ArenaOptions {
  std::uint64_t bytes = 0;       // rounded up to whole slabs
  std::uint64_t slab_bytes = 0;  // a multiple of 2 MiB
  bool try_huge_pages = true;
  // A file on tmpfs or hugetlbfs, kept after the server ends; empty: a memfd.
  std::string path;
};

class Arena {
 public:
  // Maps [p, p + n) of a mapping of the arena (pages it holds already): the
  // kernel's page tables in one call, then a read a page, which is what also
  // fills a shadow-paging hypervisor's (madvise alone left the first touch
  // at 5 us a page in such a VM). The reads race, by design, with writes of
  // objects in the same pages (their values are not used): TSan is told to
  // look away.
  static void map_in(std::byte* p, std::uint64_t n);

  // Creates and seals the memfd, or opens (creating it when absent) the
  // named file. Throws std::runtime_error saying why.
  explicit Arena(ArenaOptions options);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  int fd() const noexcept { return fd_; }
  std::uint64_t bytes() const noexcept { return bytes_; }
  std::uint64_t slab_bytes() const noexcept { return slab_bytes_; }
  std::uint32_t slab_count() const noexcept { return static_cast<std::uint32_t>(bytes_ / slab_bytes_); }
  bool huge_pages() const noexcept { return huge_; }
  // A named arena found at its path (of this size): it may hold objects.
  bool reopened() const noexcept { return reopened_; }
  const std::string& path() const noexcept { return path_; }
  // A named arena that cannot be read: unlinked and made again, empty.
  // Peers' mappings of the old file stay valid (they keep its pages).
  void start_empty();

  // Allocates slab i's pages. Blocking (call it off the strand); safe from
  // one thread while the strand hands fd() out. Empty on success, else why.
  std::string populate(std::uint32_t slab) const;

  // Where slot `slot` of `object_bytes`-sized objects starts.
  static std::uint32_t slots_per_slab(std::uint64_t slab_bytes, std::uint64_t object_bytes) noexcept {
    return object_bytes == 0 ? 0 : static_cast<std::uint32_t>(slab_bytes / object_bytes);
  }
  static std::uint64_t offset_of(std::uint32_t slot, std::uint64_t slab_bytes, std::uint64_t object_bytes) noexcept {
    const std::uint32_t per = slots_per_slab(slab_bytes, object_bytes);
    return static_cast<std::uint64_t>(slot / per) * slab_bytes + static_cast<std::uint64_t>(slot % per) * object_bytes;
  }

 private:
  int fd_ = -1;
  std::uint64_t bytes_ = 0;
  std::uint64_t slab_bytes_ = 0;
  bool huge_ = false;
  bool reopened_ = false;
  std::string path_;
  int lock_fd_ = -1;  // a named arena's PATH.lock, held while this server lives
};

// Bytes of memory this machine can still give (MemAvailable), 0 if unknown.
std::uint64_t available_memory_bytes();
// The memory a named arena of `bytes` at `path` holds already (0 when there
// is none, or one of another size): a server restarted on it needs that
// much less than its --tier-bytes.
std::uint64_t held_by_named_arena(const std::string& path, std::uint64_t bytes);

}  // namespace kvstrand::tier
