// A client's view of the node tier's shared arena: the memfd the server
// handed over, mapped into this process, and pinned for this process's
// device slab by slab (HostRegistration). Owned by NodeTier on the strand;
// every transfer copying through it holds it, so it is unmapped only after
// the last copy on it was seen complete (or never, when one was not).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hip/host_registration.hpp"

namespace kvstrand::reactor {

class ArenaMapping {
 public:
  // Maps `fd` (taken over: closed here whatever happens). Refuses, saying
  // why, a file that is not sealed against resize (a peer could shrink it
  // under this mapping) or whose size is not `bytes`.
  static std::unique_ptr<ArenaMapping> map(int fd, std::uint64_t bytes, std::uint64_t slab_bytes, std::string* why);
  ~ArenaMapping();
  ArenaMapping(const ArenaMapping&) = delete;
  ArenaMapping& operator=(const ArenaMapping&) = delete;

  std::byte* base() const noexcept { return base_; }
  std::uint64_t bytes() const noexcept { return bytes_; }
  std::uint64_t slab_bytes() const noexcept { return slab_bytes_; }
  // True when [offset, offset + n) lies inside the arena.
  bool contains(std::uint64_t offset, std::uint64_t n) const noexcept {
    return n <= bytes_ && offset <= bytes_ - n;
  }

  // Pinning, slab by slab from the start; driven by NodeTier.
  std::uint64_t pinned_bytes() const noexcept { return slabs_.size() * slab_bytes_; }
  void add_pinned(hip::HostRegistration r) { slabs_.push_back(std::move(r)); }

 private:
  ArenaMapping() = default;
  std::byte* base_ = nullptr;
  std::uint64_t bytes_ = 0;
  std::uint64_t slab_bytes_ = 0;
  std::vector<hip::HostRegistration> slabs_;
};

}  // namespace kvstrand::reactor
