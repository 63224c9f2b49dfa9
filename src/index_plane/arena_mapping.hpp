// A client's view of the node tier's shared arena: the memfd the server
// handed over, mapped into this process, and pinned for this process's
// device slab by slab (HostRegistration). Owned by ServerSession on the strand;
// every transfer copying through it holds it, so it is unmapped only after
// the last copy on it was seen complete (or never, when one was not).
#pragma once

#include "common/expected.hpp"
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device/host_registration.hpp"

namespace kvstrand::index_plane {

class ArenaMapping {
 public:
  // Maps `fd` (taken over: closed here whatever happens). Refuses, saying
  // why, a file whose size is not `bytes`, and one that is not sealed
  // against resize (a peer could shrink it under this mapping) unless it is
  // a named arena (kvstrand-server --arena-path): a regular file of this
  // user or of the server's (`server_uid`, the user this process checked it
  // runs as) that no one else may open. `read_only`: a published tenant's
  // segment, handed read-only, mapped so and never pinned (HIP has no
  // read-only registration; only CPU copies read it: PageStore's), so its
  // every byte counts as pinned.
  static common::Expected<std::unique_ptr<ArenaMapping>> map(int fd, std::uint64_t bytes, std::uint64_t slab_bytes,
                                                             uid_t server_uid, bool read_only);
  ~ArenaMapping();
  ArenaMapping(const ArenaMapping&) = delete;
  ArenaMapping& operator=(const ArenaMapping&) = delete;

  std::byte* base() const noexcept { return base_; }
  // Whether `fd` is this mapping's file, whole: a server restarted on a
  // named arena hands over the file this process has mapped and pinned.
  bool is_file(int fd) const noexcept;
  std::uint64_t bytes() const noexcept { return bytes_; }
  std::uint64_t slab_bytes() const noexcept { return slab_bytes_; }
  // True when [offset, offset + n) lies inside the arena.
  bool contains(std::uint64_t offset, std::uint64_t n) const noexcept {
    return n <= bytes_ && offset <= bytes_ - n;
  }

  // Pinning, slab by slab; driven by ArenaPinning, several slabs at once.
  // pinned_bytes() is the pinned prefix: every slab below it is pinned.
  std::uint32_t slab_count() const noexcept { return static_cast<std::uint32_t>(bytes_ / slab_bytes_); }
  std::uint64_t pinned_bytes() const noexcept {
    return read_only_ ? bytes_ : static_cast<std::uint64_t>(prefix_) * slab_bytes_;
  }
  bool read_only() const noexcept { return read_only_; }
  void add_pinned(std::uint32_t slab, device::HostRegistration r) {
    slabs_[slab].emplace(std::move(r));
    while (prefix_ < slabs_.size() && slabs_[prefix_]) ++prefix_;
  }

 private:
  ArenaMapping() = default;
  std::byte* base_ = nullptr;
  std::uint64_t bytes_ = 0;
  std::uint64_t slab_bytes_ = 0;
  std::uint64_t dev_ = 0, ino_ = 0;  // the mapped file's identity
  std::vector<std::optional<device::HostRegistration>> slabs_;  // one per slab, set once pinned
  std::uint32_t prefix_ = 0;
  bool read_only_ = false;
};

}  // namespace kvstrand::index_plane
