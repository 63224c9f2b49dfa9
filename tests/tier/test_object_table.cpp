// A persistent arena's object tables (src/tier/object_table): what a
// restarted server reads back is exactly what was committed, whatever point
// the old server was killed at; an uncommitted reservation, a corrupted
// entry, a slab of an earlier life or another format version is never read
// as an object. Over a plain buffer standing for the mapped arena.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "tier/object_table.hpp"
#include "tier/size_classes.hpp"
#include "tier/tenant_book.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

using namespace kvstrand;
using tier::Index;
using tier::ObjectTable;
using tier::SizeClasses;

namespace {

constexpr std::uint64_t kSlab = 1ull << 20;
constexpr std::uint32_t kSlabs = 4;
constexpr std::uint64_t kObject = 16384;

kv::ChunkKey key(int i) {
  kv::ChunkKey k;
  k.hash[0] = static_cast<std::byte>(i);
  k.hash[1] = static_cast<std::byte>(i >> 8);
  k.ns[3] = std::byte{7};
  k.kv_rank = 2;
  return k;
}

// One server life over the arena's bytes: the table, its classes, every
// slab ready, and (a restart) what the tables held adopted first.
struct Life {
  ObjectTable table;
  SizeClasses classes;
  ObjectTable::Recovery found;
  std::size_t duplicates = 0;

  explicit Life(std::vector<std::byte>& arena, bool recover = true)
      : table(arena.data(), arena.size(), kSlab), classes(kSlab, &table) {
    if (recover) {
      found = table.scan();
      if (found.unreadable.empty())
        for (const auto& s : found.slabs) REQUIRE(classes.adopt_slab(s.slab, s.object_bytes, s.slots, &duplicates));
    }
    for (std::uint32_t s = 0; s < kSlabs; ++s) classes.add_slab(s);
  }
  Index& index() { return *classes.index(kObject); }
  // Reserves keys [first, last) as one save, as the server does.
  Index::Reservation reserve(int first, int last, bool image_on_last = false) {
    std::vector<kv::ChunkKey> keys;
    std::vector<char> images;
    for (int i = first; i < last; ++i) {
      keys.push_back(key(i));
      images.push_back(image_on_last && i + 1 == last);
    }
    classes.make_room(index(), keys.size());
    std::unique_ptr<bool[]> flags(new bool[keys.size()]);
    for (std::size_t i = 0; i < keys.size(); ++i) flags[i] = images[i] != 0;
    return index().reserve(keys, std::span<const bool>(flags.get(), keys.size()), 1);
  }
  // Reserves and commits keys [first, last): a save whose copy ended.
  void store(int first, int last) {
    const auto r = reserve(first, last);
    REQUIRE(r.reserved == static_cast<std::uint32_t>(last - first));
    REQUIRE(index().commit(r.id, true));
  }
  std::uint32_t hit(int first, int last) {
    std::vector<kv::ChunkKey> keys;
    for (int i = first; i < last; ++i) keys.push_back(key(i));
    return index().lookup(keys, 64).tokens / 64;
  }
};

}  // namespace

TEST_CASE("object table: a described slab keeps its table before its objects, aligned, within the slab", "[tier]") {
  for (std::uint64_t object : std::vector<std::uint64_t>{4096, 16384, 100000, kSlab / 2, kSlab - 8192}) {
    INFO(object);
    const tier::SlabGeometry g = tier::described_geometry(kSlab, object);
    REQUIRE(g.per_slab > 0);
    REQUIRE(g.first_object % 4096 == 0);
    REQUIRE(g.first_object >= tier::kSlabHeaderBytes + g.per_slab * tier::kEntryBytes);
    REQUIRE(g.first_object + g.per_slab * object <= kSlab);
    // One more object would not fit with its entry.
    const std::uint64_t more = g.per_slab + 1;
    REQUIRE((tier::kSlabHeaderBytes + more * tier::kEntryBytes + 4095) / 4096 * 4096 + more * object > kSlab);
  }
  REQUIRE(tier::described_geometry(kSlab, kSlab).per_slab == 0);  // no room for the table
}

TEST_CASE("object table: a restart finds what was committed, in the same places, and never a reservation",
          "[tier][recover]") {
  std::vector<std::byte> arena(kSlabs * kSlab);
  std::vector<std::uint64_t> offsets;
  {
    Life first(arena, false);
    auto committed = first.reserve(0, 40, true);  // more than a slab: two slabs of this class
    REQUIRE(committed.reserved == 40);
    REQUIRE(first.index().commit(committed.id, true));
    for (std::uint32_t s : committed.slots) offsets.push_back(first.classes.offset_of(first.index(), s));
    auto pending = first.reserve(100, 103);  // reserved, copy under way: the server dies here
    REQUIRE(pending.reserved == 3);
  }
  Life second(arena);
  REQUIRE(second.found.unreadable.empty());
  REQUIRE(second.found.objects == 40);
  REQUIRE(second.found.dropped_uncommitted == 3);
  REQUIRE(second.duplicates == 0);
  REQUIRE(second.hit(0, 40) == 40);
  REQUIRE(second.hit(100, 103) == 0);
  // The same objects at the same offsets: the bytes a client wrote are there.
  std::vector<kv::ChunkKey> keys;
  for (int i = 0; i < 40; ++i) keys.push_back(key(i));
  const auto lease = second.index().lease(keys, 64, 1);
  REQUIRE(lease.hit.tokens == 40 * 64);
  REQUIRE(lease.hit.checkpoints == std::vector<std::uint32_t>{40 * 64});  // the image flag came back
  for (std::size_t i = 0; i < 40; ++i) REQUIRE(second.classes.offset_of(second.index(), lease.slots[i]) == offsets[i]);
  // The dropped reservations' slots are free again, and new saves work.
  auto more = second.reserve(200, 210);
  REQUIRE(more.reserved == 10);
  REQUIRE(second.index().commit(more.id, true));
  Life third(arena);
  REQUIRE(third.found.objects == 50);
  REQUIRE(third.found.dropped_uncommitted == 0);  // marked free when the second life read them
}

TEST_CASE("object table: an object evicted, or aborted, is not found again",
          "[tier][recover]") {
  std::vector<std::byte> arena(kSlabs * kSlab);
  {
    Life first(arena, false);
    first.store(0, 10);
    auto b = first.reserve(10, 12);
    REQUIRE(first.index().commit(b.id, false));  // the copy failed: aborted
    // Twice what the slabs hold: the oldest committed objects are evicted
    // for these (no lookup in between: a lookup would give them a second chance).
    const std::uint32_t capacity = kSlabs * tier::described_geometry(kSlab, kObject).per_slab;
    for (std::uint32_t i = 0; i < 2 * capacity; i += 10) {
      first.store(1000 + static_cast<int>(i), 1010 + static_cast<int>(i));
    }
    REQUIRE(first.index().stats().evictions > 0);
  }
  Life second(arena);
  REQUIRE(second.hit(0, 1) == 0);    // evicted before the restart: gone after it
  REQUIRE(second.hit(10, 12) == 0);  // aborted
  REQUIRE(second.found.dropped_uncommitted == 0);
  REQUIRE(second.found.objects == second.index().stats().objects);
  REQUIRE(second.found.objects > 0);
}

TEST_CASE("object table: a corrupted entry drops its object only, a corrupted slab header its slab only",
          "[tier][recover]") {
  std::vector<std::byte> arena(kSlabs * kSlab);
  {
    Life first(arena, false);
    first.store(0, 5);
  }
  // Entry 2 of slab 0 (the third chunk): one byte of its key flipped.
  arena[tier::kSlabHeaderBytes + 2 * tier::kEntryBytes + 50] ^= std::byte{1};
  {
    Life second(arena);
    REQUIRE(second.found.objects == 4);
    REQUIRE(second.found.dropped_corrupt == 1);
    REQUIRE(second.hit(0, 5) == 2);  // the run stops at the dropped chunk
    REQUIRE(second.hit(3, 5) == 2);
  }
  arena[20] ^= std::byte{1};  // slab 0's header
  Life third(arena);
  REQUIRE(third.found.objects == 0);
  REQUIRE(third.found.dropped_corrupt == 1);
  REQUIRE(third.hit(3, 5) == 0);
}

TEST_CASE("object table: another format version or geometry is unreadable, never misread", "[tier][recover]") {
  std::vector<std::byte> arena(kSlabs * kSlab);
  {
    Life first(arena, false);
    first.store(0, 5);
  }
  SECTION("a later version") {
    arena[8] = std::byte{2};  // the header's version, little-endian
    ObjectTable t(arena.data(), arena.size(), kSlab);
    const auto r = t.scan();
    REQUIRE(r.unreadable.find("format version 2") != std::string::npos);
    REQUIRE(r.slabs.empty());
    // The census, which a restart reads before adopting anything, says so too.
    REQUIRE(t.census().unreadable == r.unreadable);
    REQUIRE(t.census().slots_by_object_size.empty());
  }
  SECTION("other slabs") {
    ObjectTable t(arena.data(), arena.size(), kSlab / 2);
    REQUIRE(t.scan().unreadable.find("slabs of 1048576 B") != std::string::npos);
    REQUIRE(t.census().unreadable == t.scan().unreadable);
  }
  SECTION("readable: the census counts the slots of each object size the scan then hands over, a slab at a time") {
    ObjectTable t(arena.data(), arena.size(), kSlab);
    const ObjectTable::Census c = t.census();
    REQUIRE(c.unreadable.empty());
    REQUIRE(c.slots_by_object_size.size() == 1);
    std::uint64_t slots = 0, slabs = 0;
    const auto r = t.scan([&](const ObjectTable::Slab& slab) {
      slots += slab.slots.size();
      ++slabs;
    });
    REQUIRE(slabs >= 1);
    REQUIRE(c.slots_by_object_size.begin()->second == slots);
    REQUIRE(r.objects == 5);
    REQUIRE(r.slabs.empty());  // told to `each`, not kept
  }
  SECTION("slots aligned otherwise (a server started with --disk since)") {
    constexpr std::uint64_t kOdd = kObject + 100;  // 16484 B: 16484 apart, or 20480 aligned to 4 KiB
    std::vector<std::byte> other(kSlabs * kSlab);
    {
      ObjectTable t(other.data(), other.size(), kSlab);
      SizeClasses c(kSlab, &t);
      c.add_slab(0);
      Index& idx = *c.index(kOdd);
      c.make_room(idx, 1);
    }
    ObjectTable t(other.data(), other.size(), kSlab, 4096);
    const auto r = t.scan();
    REQUIRE(r.unreadable.find("16484 B apart") != std::string::npos);
    REQUIRE(r.unreadable.find("20480 B apart") != std::string::npos);
    // The same alignment reads it.
    ObjectTable same(other.data(), other.size(), kSlab);
    REQUIRE(same.scan().unreadable.empty());
  }
}

TEST_CASE("object table: slots aligned to 4 KiB are laid out and found again aligned", "[tier][recover]") {
  constexpr std::uint64_t kOdd = kObject + 100;
  std::vector<std::byte> arena(kSlabs * kSlab);
  std::vector<std::uint64_t> offsets;
  {
    ObjectTable t(arena.data(), arena.size(), kSlab, 4096);
    SizeClasses c(kSlab, &t);
    for (std::uint32_t s = 0; s < kSlabs; ++s) c.add_slab(s);
    Index& idx = *c.index(kOdd);
    for (int i = 0; i < 3; ++i) {
      c.make_room(idx, 1);
      std::uint32_t slot = 0;
      REQUIRE(idx.reserve(key(i), false, &slot) == Index::Reserve::reserved);
      idx.commit(key(i));
      offsets.push_back(c.offset_of(idx, slot));
      REQUIRE(offsets.back() % 4096 == 0);
    }
  }
  ObjectTable t(arena.data(), arena.size(), kSlab, 4096);
  SizeClasses c(kSlab, &t);
  const auto r = t.scan();
  REQUIRE(r.unreadable.empty());
  REQUIRE(r.objects == 3);
  for (const auto& s : r.slabs) REQUIRE(c.adopt_slab(s.slab, s.object_bytes, s.slots, nullptr));
  Index& idx = *c.index(kOdd);
  for (int i = 0; i < 3; ++i) {
    const kv::ChunkKey k[] = {key(i)};
    auto slots = idx.read_lock(k);
    REQUIRE(slots);
    REQUIRE(c.offset_of(idx, (*slots)[0]) == offsets[static_cast<std::size_t>(i)]);
  }
}

TEST_CASE("object table: a slab given to another class holds no entry of its earlier life", "[tier][recover]") {
  std::vector<std::byte> arena(kSlabs * kSlab);
  {
    Life first(arena, false);
    first.store(0, 5);
  }
  // Its header lost (as if never written), its entries still there: the
  // slab is free for any class, and a class taking it clears them first.
  std::memset(arena.data(), 0, tier::kSlabHeaderBytes);
  {
    ObjectTable t(arena.data(), arena.size(), kSlab);
    SizeClasses classes(kSlab, &t);
    REQUIRE(t.scan().slabs.empty());
    for (std::uint32_t s = 0; s < kSlabs; ++s) classes.add_slab(s);
    Index* other = classes.index(kObject * 2);
    classes.make_room(*other, 1);  // takes slab 0
  }
  Life again(arena);
  REQUIRE(again.found.objects == 0);
  REQUIRE(again.found.dropped_uncommitted == 0);
  REQUIRE(again.found.dropped_corrupt == 0);
}

TEST_CASE("object table: objects found after a restart are evicted like any other when the arena is full",
          "[tier][recover]") {
  // Before: restored objects were not counted as evictable, so a restarted
  // server on a full named arena refused every save as full, for good.
  std::vector<std::byte> arena(kSlabs * kSlab);
  const int capacity = static_cast<int>(tier::described_geometry(kSlab, kObject).per_slab * kSlabs);
  {
    Life first(arena, false);
    first.store(0, capacity);
    REQUIRE(first.index().stats().objects == static_cast<std::size_t>(capacity));  // every slot of every slab
  }
  Life second(arena);
  REQUIRE(second.found.objects == static_cast<std::size_t>(capacity));
  // Their namespace is counted (/debug/tier lists it; a miss of it is not "other_namespace").
  const std::uint64_t all = static_cast<std::uint64_t>(capacity) * second.index().object_bytes();
  REQUIRE(second.index().holds_namespace(key(0).ns));
  REQUIRE(second.classes.namespace_bytes().at(key(0).ns) == all);
  // Tenants set after the objects were found (as the server does) charge each to its tenant.
  tier::TenantBook book;
  second.classes.set_tenants(&book);
  REQUIRE(book.used(0) == all);
  REQUIRE(second.hit(0, capacity) == static_cast<std::uint32_t>(capacity));
  second.store(10000, 10010);  // REQUIREs all ten reserved: ten restored objects make room
  REQUIRE(second.hit(10000, 10010) == 10);
  int restored_left = 0;
  for (int i = 0; i < capacity; ++i) restored_left += static_cast<int>(second.hit(i, i + 1));
  REQUIRE(restored_left == capacity - 10);
}

TEST_CASE("object table: a slab of the format before the stride field (stride 0) is read, not dropped", "[tier][recover]") {
  // Tables written before slabs recorded their stride have 0 there (the
  // bytes were reserved zeros, under the header checksum): their objects
  // lie object_bytes apart. An upgrade must keep them.
  std::vector<std::byte> arena(kSlabs * kSlab);
  {
    Life first(arena, false);
    first.store(0, 5);
  }
  std::byte* h = arena.data();  // slab 0's header: stride at 40, checksum of [0, 56) at 56
  std::memset(h + 40, 0, 8);
  const std::uint64_t sum = XXH3_64bits(h, 56);
  std::memcpy(h + 56, &sum, 8);  // host byte order, as the table stores its fields
  Life upgraded(arena);
  INFO(upgraded.found.unreadable);
  REQUIRE(upgraded.found.unreadable.empty());
  REQUIRE(upgraded.found.objects == 5);
  REQUIRE(upgraded.found.dropped_corrupt == 0);
  REQUIRE(upgraded.hit(0, 5) == 5);
}
