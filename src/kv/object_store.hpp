// The bookkeeping of a host tier: fixed-size object slots in an arena, keyed
// by ChunkKey, with LRU eviction of objects no one is reading or writing.
//
// Pure (no I/O, no memory of its own): LocalTier pairs it with a pinned arena
// and does the copies. Rules:
// - A key already stored (or being written) is not rewritten.
// - A reserved object is invisible until commit(); abort() frees it, so a
//   reader sees a whole object or a miss, never a half-written one.
// - Eviction takes only committed objects with no readers, least recently
//   used first; if that is not enough the key is refused (`full`). An object
//   an in-flight copy reads or writes is never evicted or reused.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "kv/chunk_keys.hpp"
#include "kv/hit_plan.hpp"

namespace kvstrand::kv {

struct ChunkKeyLess {
  bool operator()(const ChunkKey& a, const ChunkKey& b) const noexcept {
    if (a.ns != b.ns) return a.ns < b.ns;
    if (a.kv_rank != b.kv_rank) return a.kv_rank < b.kv_rank;
    return a.hash < b.hash;
  }
};

class ObjectStore {
 public:
  struct Stats {
    std::uint64_t capacity_bytes = 0;
    std::uint64_t used_bytes = 0;
    std::size_t objects = 0;   // committed
    std::size_t writing = 0;   // reserved, not yet committed
    std::size_t pinned = 0;    // committed objects with readers
    std::uint64_t evictions = 0;
    std::uint64_t refused_full = 0;
    std::uint64_t lookup_hits = 0;    // chunks found by lookups
    std::uint64_t lookup_misses = 0;  // lookups that stopped short of their keys
  };

  ObjectStore(std::uint64_t capacity_bytes, std::uint64_t object_bytes);

  std::uint32_t slots() const noexcept { return static_cast<std::uint32_t>(free_.size() + by_key_.size()); }

  enum class Reserve { reserved, exists, full };
  Reserve reserve(const ChunkKey& key, bool has_image, std::uint32_t* slot);
  void commit(const ChunkKey& key);
  void abort(const ChunkKey& key);

  // The longest run of committed objects from keys[0], and the boundaries
  // (in tokens) whose image is stored within it.
  HitSource lookup(std::span<const ChunkKey> keys, std::uint32_t chunk_tokens);

  // All keys committed: pins them against eviction and returns their slots.
  // Otherwise pins nothing.
  std::optional<std::vector<std::uint32_t>> pin(std::span<const ChunkKey> keys);
  void unpin(std::span<const ChunkKey> keys);
  bool has_image(const ChunkKey& key) const;

  Stats stats() const;

 private:
  struct Object {
    std::uint32_t slot = 0;
    bool has_image = false;
    bool committed = false;
    std::uint32_t readers = 0;
    std::list<ChunkKey>::iterator lru;  // valid while committed
  };
  bool evict_one();
  void touch(Object& o, const ChunkKey& key);

  std::uint64_t object_bytes_;
  std::uint64_t capacity_bytes_;
  std::vector<std::uint32_t> free_;
  std::map<ChunkKey, Object, ChunkKeyLess> by_key_;
  std::list<ChunkKey> lru_;  // committed objects, most recent at the back
  Stats stats_{};
};

}  // namespace kvstrand::kv
