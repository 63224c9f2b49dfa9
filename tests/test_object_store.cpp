// The tier store's bookkeeping (F25, F27): no rewrite, nothing half-written
// visible, LRU eviction of unpinned objects only, refusal when full.
#include <catch2/catch.hpp>

#include "kv/object_store.hpp"

using namespace kvstrand;
using kv::ObjectStore;

namespace {
kv::ChunkKey key(int i) {
  kv::ChunkKey k;
  k.hash[0] = static_cast<std::byte>(i);
  k.hash[1] = static_cast<std::byte>(i >> 8);
  return k;
}
std::uint32_t reserve_commit(ObjectStore& s, int i, bool image = false) {
  std::uint32_t slot = 0;
  REQUIRE(s.reserve(key(i), image, &slot) == ObjectStore::Reserve::reserved);
  s.commit(key(i));
  return slot;
}
}  // namespace

TEST_CASE("object store: an object is invisible until committed; abort frees it", "[kv][store]") {
  ObjectStore s(4 * 100, 100);
  REQUIRE(s.slots() == 4);
  std::uint32_t slot = 0;
  REQUIRE(s.reserve(key(1), true, &slot) == ObjectStore::Reserve::reserved);
  const kv::ChunkKey k1[] = {key(1)};
  REQUIRE(s.lookup(k1, 256).tokens == 0);
  REQUIRE_FALSE(s.pin(k1).has_value());
  REQUIRE(s.reserve(key(1), true, &slot) == ObjectStore::Reserve::exists);  // not written twice
  s.abort(key(1));
  REQUIRE(s.stats().writing == 0);
  reserve_commit(s, 1, true);
  auto h = s.lookup(k1, 256);
  REQUIRE(h.tokens == 256);
  REQUIRE(h.checkpoints == std::vector<std::uint32_t>{256});
}

TEST_CASE("object store: lookup returns the consecutive run and its image boundaries", "[kv][store]") {
  ObjectStore s(10 * 100, 100);
  reserve_commit(s, 0, false);
  reserve_commit(s, 1, true);
  reserve_commit(s, 3, true);  // not consecutive with 0..1
  const kv::ChunkKey ks[] = {key(0), key(1), key(2), key(3)};
  auto h = s.lookup(ks, 256);
  REQUIRE(h.tokens == 512);
  REQUIRE(h.checkpoints == std::vector<std::uint32_t>{512});
  REQUIRE(s.stats().lookup_misses == 1);
}

TEST_CASE("object store: a full store evicts least recently used unpinned objects, else refuses (F25, F27)", "[kv][store]") {
  ObjectStore s(3 * 100, 100);
  reserve_commit(s, 1);
  reserve_commit(s, 2);
  reserve_commit(s, 3);
  const kv::ChunkKey k1[] = {key(1)};
  REQUIRE(s.lookup(k1, 256).tokens == 256);  // 1 is now the most recently used
  std::uint32_t slot = 0;
  REQUIRE(s.reserve(key(4), false, &slot) == ObjectStore::Reserve::reserved);  // evicts 2
  const kv::ChunkKey k2[] = {key(2)};
  REQUIRE(s.lookup(k2, 256).tokens == 0);
  s.commit(key(4));
  // Pin everything: nothing may be evicted now.
  const kv::ChunkKey all[] = {key(1), key(3), key(4)};
  REQUIRE(s.pin(all).has_value());
  REQUIRE(s.reserve(key(5), false, &slot) == ObjectStore::Reserve::full);
  REQUIRE(s.stats().refused_full == 1);
  REQUIRE(s.stats().pinned == 3);
  s.unpin(all);
  REQUIRE(s.reserve(key(5), false, &slot) == ObjectStore::Reserve::reserved);
  REQUIRE(s.stats().evictions == 2);
}

TEST_CASE("object store: an object being written is never evicted", "[kv][store]") {
  ObjectStore s(2 * 100, 100);
  std::uint32_t a = 0, b = 0, c = 0;
  REQUIRE(s.reserve(key(1), false, &a) == ObjectStore::Reserve::reserved);
  REQUIRE(s.reserve(key(2), false, &b) == ObjectStore::Reserve::reserved);
  REQUIRE(s.reserve(key(3), false, &c) == ObjectStore::Reserve::full);  // both are mid-copy
  REQUIRE(a != b);
}
