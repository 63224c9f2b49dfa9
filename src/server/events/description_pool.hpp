// The server's KV-event descriptions (--events), each held once however
// many objects carry it: an arena object and its copy on the disk, or the
// same chunk saved again under another key. Counted by holder; an id names
// one. Each costs its bytes, a 16 B entry and at most 8 B of the lookup
// table; a holder 4 B (its id). Bounded by what holds them: the indexes'
// slots, each holding at most one.
//
// On the server's strand (TierEvents).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace kvstrand::server {

class DescriptionPool {
 public:
  using Id = std::uint32_t;
  static constexpr Id kNone = 0;

  DescriptionPool();
  DescriptionPool(const DescriptionPool&) = delete;
  DescriptionPool& operator=(const DescriptionPool&) = delete;

  // `description`'s id, held once more (the same bytes: the same id); kNone
  // for an empty one.
  Id hold(std::string_view description);
  // One more holder of `id` (kNone: nothing).
  void hold(Id id) noexcept;
  // One holder fewer; the last one's going frees it (kNone: nothing).
  void release(Id id) noexcept;
  // Its bytes; empty for kNone.
  std::string_view at(Id id) const noexcept;

  std::size_t size() const noexcept { return live_; }                  // descriptions held
  std::uint64_t bytes() const noexcept { return bytes_; }              // their bytes
  std::uint32_t holders(Id id) const noexcept { return id == kNone ? 0 : entries_[id - 1].holders; }

 private:
  struct Entry {
    std::unique_ptr<char[]> bytes;  // the description, after its 4-byte size
    std::uint32_t holders = 0;      // 0: free (its id on free_)
    std::uint32_t hash = 0;         // of the bytes: a probe compares bytes only where it matches
  };
  std::uint32_t hash_of(std::string_view d) const noexcept;
  std::size_t slot_of(std::string_view d, std::uint32_t hash) const noexcept;  // where d is, or the empty one to take
  void grow();
  void unlink(Id id) noexcept;

  // The hash's seed, this process's own: descriptions come from clients, and
  // ones made to collide in the table would make every probe a long walk
  // on the server's strand.
  std::uint64_t seed_;
  std::vector<Entry> entries_;  // by id - 1
  std::vector<Id> free_;
  // Open addressing (linear probes, at most half full): ids by hash.
  std::vector<Id> table_;
  std::size_t live_ = 0;
  std::uint64_t bytes_ = 0;
};

}  // namespace kvstrand::server
