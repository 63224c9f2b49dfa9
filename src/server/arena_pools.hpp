// The server's memory as pools (tier::SizeClasses' pools): pool 0 the
// arena, pool p > 0 a tenant's segment (--tenant-segment: a memfd of its
// own, handed at hello only to that tenant's clients). Their slabs are
// numbered one pool after another, and the server's own mapping (with
// --l2, --disk or --arena-path) holds them side by side in that order, so
// that an offset in that numbering is a place whichever pool it is in.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tier/arena.hpp"

namespace kvstrand::server {

class ArenaPools {
 public:
  // Beside `arena` (which outlives this), a segment for each of `segments`
  // (tenant -> bytes, whole slabs); those of `published` tenants also get a
  // read-only descriptor for their readers. Throws naming --tenant-segment
  // or --public-tenant when one cannot be made.
  ArenaPools(tier::Arena& arena, const std::map<std::string, std::uint64_t>& segments,
             const std::set<std::string>& published, bool huge_pages);
  ~ArenaPools();
  ArenaPools(const ArenaPools&) = delete;
  ArenaPools& operator=(const ArenaPools&) = delete;

  std::size_t pools() const noexcept { return segments_.size() + 1; }
  const tier::Arena& pool(std::size_t p) const { return p == 0 ? arena_ : *segments_.at(p - 1); }
  // The pool a tenant's clients are handed (0: the arena).
  std::size_t pool_of(const std::string& tenant) const;
  // A published tenant's pool, and the descriptor its readers are handed:
  // opened read-only, so that no mapping of it can be made writable, and of
  // a file only the server's user may open again (a reader could reopen it
  // read-write through /proc/self/fd otherwise). -1 for any other tenant.
  int read_only_fd(const std::string& tenant) const;
  // What a client of pool p is handed at hello: the pool's fd, or (`reads`
  // a published tenant) that tenant's read-only one.
  int handed_fd(std::size_t p, const std::string& reads) const {
    return reads.empty() ? pool(p).fd() : read_only_fd(reads);
  }
  // Each published tenant's pool (ServerFacts::published).
  std::map<std::string, std::size_t> published() const;
  std::uint32_t slab_count() const noexcept;  // every pool's
  std::uint64_t segment_bytes() const noexcept;
  // Where pool p starts in the numbering, in bytes: the pools before it.
  std::uint64_t base(std::size_t p) const;
  // Each pool's end, in slabs (tier::SizeClasses::set_pools).
  std::vector<std::uint32_t> ends() const;
  // Allocates slab `slab` (in the numbering) of its pool: tier::Arena::populate.
  std::string populate(std::uint32_t slab) const;

  // The server's mapping of every pool, side by side; throws naming `flag`.
  std::byte* map(const char* flag);
  void unmap();
  std::byte* mapped() const noexcept { return mapped_; }

 private:
  tier::Arena& arena_;
  std::vector<std::unique_ptr<tier::Arena>> segments_;
  std::map<std::string, std::size_t> pool_of_;
  std::map<std::string, int> read_only_fds_;
  std::byte* mapped_ = nullptr;
  std::pair<void*, std::size_t> reserved_{nullptr, 0};  // the address range the mapping lies in
};

}  // namespace kvstrand::server
