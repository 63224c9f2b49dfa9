// An arena's slabs shared by several object sizes (several registrations of
// different groups): slabs given on demand, offsets that never overlap, hold
// ids that name their class, eviction that stays within a class.
#include <catch2/catch.hpp>

#include <set>

#include "tier/size_classes.hpp"

using namespace kvstrand;
using tier::Index;
using tier::SizeClasses;

namespace {
constexpr std::uint64_t kSlab = 1000;

kv::ChunkKey key(int i, int ns = 0) {
  kv::ChunkKey k;
  k.hash[0] = static_cast<std::byte>(i);
  k.hash[1] = static_cast<std::byte>(i >> 8);
  k.ns[0] = static_cast<std::byte>(ns);
  return k;
}
// Reserves and commits one object through the classes, as the server does.
std::optional<std::uint32_t> store(SizeClasses& c, Index& idx, const kv::ChunkKey& k) {
  c.make_room(idx, 1);
  std::uint32_t slot = 0;
  if (idx.reserve(k, false, &slot) != Index::Reserve::reserved) return std::nullopt;
  idx.commit(k);
  return slot;
}
}  // namespace

TEST_CASE("size classes: one index per object size, slabs given only when a class is out of room", "[tier]") {
  SizeClasses c(kSlab);
  for (std::uint32_t s = 0; s < 4; ++s) c.add_slab(s);
  Index* small = c.index(100);  // 10 a slab
  Index* big = c.index(300);    // 3 a slab
  REQUIRE(small != nullptr);
  REQUIRE(big != nullptr);
  REQUIRE(small != big);
  REQUIRE(c.index(100) == small);  // the same size: the same class
  REQUIRE(small->slots() == 0);    // no slab before it is needed
  REQUIRE(c.free_slabs() == 4);
  REQUIRE(store(c, *small, key(1)));
  REQUIRE(small->slots() == 10);
  REQUIRE(c.free_slabs() == 3);
  for (int i = 2; i <= 10; ++i) REQUIRE(store(c, *small, key(i)));
  REQUIRE(c.free_slabs() == 3);  // ten fit the first slab
  REQUIRE(store(c, *big, key(1, 1)));
  REQUIRE(c.free_slabs() == 2);
  // Every object's bytes lie in its own slab's range and no two overlap.
  std::set<std::pair<std::uint64_t, std::uint64_t>> ranges;
  auto place = [&](const Index& idx, std::uint32_t slot) {
    const std::uint64_t at = c.offset_of(idx, slot);
    REQUIRE(at / kSlab == (at + idx.object_bytes() - 1) / kSlab);  // never across a slab's end
    for (const auto& [b, e] : ranges) REQUIRE((at + idx.object_bytes() <= b || at >= e));
    ranges.insert({at, at + idx.object_bytes()});
  };
  for (int i = 1; i <= 10; ++i) place(*small, small->read_lock(std::vector{key(i)})->front());
  place(*big, big->read_lock(std::vector{key(1, 1)})->front());
  REQUIRE(c.index(kSlab + 1) == nullptr);  // larger than a slab
  REQUIRE(c.stats().objects == 11);
}

TEST_CASE("size classes: a hold id names its class, and owners' holds end across classes", "[tier]") {
  SizeClasses c(kSlab);
  for (std::uint32_t s = 0; s < 4; ++s) c.add_slab(s);
  Index* a = c.index(100);
  Index* b = c.index(200);
  REQUIRE(store(c, *a, key(1)));
  REQUIRE(store(c, *b, key(1, 1)));
  const auto la = a->lease(std::vector{key(1)}, 64, 7);
  const auto lb = b->lease(std::vector{key(1, 1)}, 64, 7);
  REQUIRE(la.id != 0);
  REQUIRE(lb.id != 0);
  REQUIRE(la.id != lb.id);
  REQUIRE(c.index_of_hold(la.id) == a);
  REQUIRE(c.index_of_hold(lb.id) == b);
  REQUIRE(c.index_of_hold(1) == nullptr);  // an id no class issued
  REQUIRE(c.held_by(7).leases == 2);
  REQUIRE(c.holds().size() == 2);
  REQUIRE(c.release_owner(7) == 2);
  REQUIRE(c.stats().pinned == 0);
}

TEST_CASE("size classes: with every slab given, a class evicts only its own objects", "[tier]") {
  SizeClasses c(kSlab);
  c.add_slab(0);
  c.add_slab(1);
  Index* a = c.index(500);  // 2 a slab
  Index* b = c.index(250);  // 4 a slab
  REQUIRE(store(c, *a, key(1)));
  REQUIRE(store(c, *b, key(1, 1)));
  REQUIRE(c.free_slabs() == 0);
  REQUIRE(store(c, *a, key(2)));
  REQUIRE(store(c, *a, key(3)));  // evicts key(1) of a, not b's
  REQUIRE(a->stats().evictions == 1);
  REQUIRE(b->stats().evictions == 0);
  REQUIRE(b->present_run(std::vector{key(1, 1)}) == 1);
  for (int i = 2; i <= 4; ++i) REQUIRE(store(c, *b, key(i, 1)));
  REQUIRE(b->stats().evictions == 0);  // b's slab holds four
  REQUIRE(a->slots() == 2);
}

TEST_CASE("size classes: a reservation needing more than one slab takes every ready slab it needs before evicting",
          "[tier]") {
  SizeClasses c(kSlab);
  for (std::uint32_t s = 0; s < 4; ++s) c.add_slab(s);
  Index* idx = c.index(300);  // 3 a slab
  REQUIRE(store(c, *idx, key(1)));
  // Seven new keys at once: two free slots here, and two more slabs needed.
  std::vector<kv::ChunkKey> keys;
  for (int i = 10; i < 17; ++i) keys.push_back(key(i));
  c.make_room(*idx, keys.size());
  REQUIRE(c.free_slabs() == 1);
  std::unique_ptr<bool[]> images(new bool[keys.size()]());
  const Index::Reservation r = idx->reserve(keys, std::span<const bool>(images.get(), keys.size()), 1);
  REQUIRE(r.reserved == 7);
  REQUIRE(r.full == 0);
  REQUIRE(idx->stats().evictions == 0);  // key 1 stays: there was room
  REQUIRE(idx->present_run(std::vector{key(1)}) == 1);
}

TEST_CASE("size classes: shaped slots are aligned, leave room for a header before each object and the slab's, and "
          "say which slab a class took",
          "[tier]") {
  constexpr std::uint64_t kBlock = 64, kBig = 10 * kBlock;
  SizeClasses c(kBig, nullptr, tier::SlotShape{kBlock, kBlock, kBlock});
  std::vector<std::pair<std::uint32_t, std::uint64_t>> assigned;
  c.on_slab_assigned([&](std::uint32_t slab, std::uint64_t object) { assigned.emplace_back(slab, object); });
  for (std::uint32_t s = 0; s < 2; ++s) c.add_slab(s);
  Index& idx = *c.index(100);  // stride: 64 + 100 rounded up to 64 = 192; (640 - 64) / 192 = 3 a slab
  REQUIRE(c.stride(100) == 192);
  std::set<std::uint64_t> offsets;
  for (int i = 0; i < 6; ++i) {
    const auto slot = store(c, idx, key(i));
    REQUIRE(slot);
    const std::uint64_t off = c.offset_of(idx, *slot);
    REQUIRE(off % kBlock == 0);
    REQUIRE(off % kBig >= 2 * kBlock);           // after the slab's header and its own
    REQUIRE(off % kBig + 100 <= kBig);           // within its slab
    offsets.insert(off);
  }
  REQUIRE(offsets.size() == 6);
  REQUIRE(assigned == std::vector<std::pair<std::uint32_t, std::uint64_t>>{{0, 100}, {1, 100}});
  REQUIRE_FALSE(store(c, idx, key(6)) == std::nullopt);  // evicts: the 2 slabs hold 3 each
  REQUIRE(idx.stats().evictions == 1);
  REQUIRE(c.index(kBig - kBlock) == nullptr);  // an object with its header does not fit
}

TEST_CASE("size classes: pools keep each class to its own slabs (a tenant's segment)", "[tier][tenants]") {
  SizeClasses c(kSlab);
  c.set_pools({2, 5});  // pool 0: slabs 0-1 (the arena); pool 1: slabs 2-4 (a segment)
  for (std::uint32_t s = 0; s < 5; ++s) c.add_slab(s);
  REQUIRE(c.pools() == 2);
  REQUIRE(c.pool_of_slab(1) == 0);
  REQUIRE(c.pool_of_slab(2) == 1);
  REQUIRE(c.pool_base(1) == 2 * kSlab);
  REQUIRE(c.pool_bytes(0) == 2 * kSlab);
  REQUIRE(c.pool_bytes(1) == 3 * kSlab);
  Index* shared = c.index(500);  // 2 a slab
  Index* own = c.index(500, 1);
  REQUIRE(shared != own);
  REQUIRE(c.index(500, 2) == nullptr);  // no such pool
  REQUIRE(c.pool_of(*own) == 1);
  // The arena's class fills its two slabs, then evicts its own: never a
  // slab of the segment, whose class still has all three.
  for (int i = 0; i < 4; ++i) REQUIRE(store(c, *shared, key(i)));
  REQUIRE(shared->slots() == 4);
  REQUIRE(c.room(*shared) == 4);  // its own, evictable: none of the segment's free slabs
  REQUIRE(store(c, *shared, key(4)));
  REQUIRE(shared->slots() == 4);
  REQUIRE(c.free_slabs() == 3);
  for (int i = 0; i < 6; ++i) {
    const auto slot = store(c, *own, key(i, 1));
    REQUIRE(slot);
    const std::uint64_t off = c.offset_of(*own, *slot);
    REQUIRE(off >= c.pool_base(1));
    REQUIRE(off + 500 <= c.pool_base(1) + c.pool_bytes(1));
  }
  REQUIRE(c.free_slabs() == 0);
}

TEST_CASE("size classes: a class's index never makes room for more slots than its pool's slabs hold", "[tier]") {
  SizeClasses c(kSlab);
  c.set_slab_count(60);
  c.set_pools({40, 60});  // pool 0: 40 slabs, pool 1: 20
  for (std::uint32_t s = 0; s < 60; ++s) c.add_slab(s);
  Index* arena = c.index(100);     // 10 a slab: at most 400 slots
  Index* segment = c.index(100, 1);  // at most 200
  for (int i = 0; i < 400; ++i) REQUIRE(store(c, *arena, key(i)));
  for (int i = 0; i < 200; ++i) REQUIRE(store(c, *segment, key(i, 1)));
  // Grown a quarter ahead as slabs came, each stops at its pool's end (a
  // quarter past 365 slots would have been 456).
  CHECK(arena->slots() == 400);
  CHECK(arena->slot_room() == 400);
  CHECK(segment->slots() == 200);
  CHECK(segment->slot_room() == 200);
}
