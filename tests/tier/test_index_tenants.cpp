// The index's tenants (TenantBook's rule, applied as the CLOCK hand turns):
// a tenant past its quota, or about to pass it, evicts its own objects; no
// tenant evicts another below its quota; without quotas, plain CLOCK.
#include <catch2/catch.hpp>

#include "index_keys.hpp"
#include "tier/index.hpp"
#include "tier/tenant_book.hpp"

using namespace kvstrand;
using kvstrand::test::key;
using tier::Index;

namespace {
// Objects of 1 KiB in 10 slots; tenant a's quota 4 KiB, b's 3 KiB, c none.
struct Tenants {
  tier::TenantBook book{{{"a", 4096}, {"b", 3072}}};
  Index idx{10 * 1024, 1024};
  tier::TenantId a = *book.id_of("a"), b = *book.id_of("b"), c = *book.id_of("c");
  Tenants() { idx.set_tenants(&book); }
  Index::Reserve put(int i, tier::TenantId t) {
    std::uint32_t slot = 0;
    const auto r = idx.reserve(key(i), false, &slot, t);
    if (r == Index::Reserve::reserved) idx.commit(key(i));
    return r;
  }
  bool has(int i) {
    const kv::ChunkKey k[] = {key(i)};
    return idx.present_run(k) == 1;
  }
};
}  // namespace

TEST_CASE("index: a tenant past its quota evicts its own objects, never another's reserve", "[tier][index]") {
  Tenants t;
  for (int i = 0; i < 3; ++i) REQUIRE(t.put(i, t.b) == Index::Reserve::reserved);  // b: its whole quota
  for (int i = 10; i < 17; ++i) REQUIRE(t.put(i, t.a) == Index::Reserve::reserved);  // a: 7 KiB, past its 4
  REQUIRE(t.idx.free_slots() == 0);
  // a floods: each new object of a's takes one of a's, b keeps all three.
  for (int i = 20; i < 60; ++i) REQUIRE(t.put(i, t.a) == Index::Reserve::reserved);
  for (int i = 0; i < 3; ++i) REQUIRE(t.has(i));
  REQUIRE(t.book.used(t.b) == 3072);
  REQUIRE(t.book.used(t.a) == 7 * 1024);
  REQUIRE(t.book.evicted(t.b) == 0);
  REQUIRE(t.book.evicted(t.a) == 40);
  // c (no quota, so no reserve) takes what a holds above its quota, never below.
  REQUIRE(t.put(100, t.c) == Index::Reserve::reserved);  // c (no quota): from a's excess
  REQUIRE(t.put(101, t.c) == Index::Reserve::reserved);
  REQUIRE(t.put(102, t.c) == Index::Reserve::reserved);
  REQUIRE(t.book.used(t.a) == 4096);  // a down to its quota, no further
  REQUIRE(t.put(103, t.c) == Index::Reserve::reserved);  // now c evicts its own
  REQUIRE(t.book.used(t.a) == 4096);
  REQUIRE(t.book.used(t.c) == 3072);
}

TEST_CASE("index: a tenant whose only victims are held or another's reserve is refused, not let past", "[tier][index]") {
  Tenants t;
  for (int i = 0; i < 4; ++i) REQUIRE(t.put(i, t.a) == Index::Reserve::reserved);   // a's quota
  for (int i = 10; i < 13; ++i) REQUIRE(t.put(i, t.b) == Index::Reserve::reserved);  // b's quota
  for (int i = 20; i < 23; ++i) REQUIRE(t.put(i, t.c) == Index::Reserve::reserved);
  const kv::ChunkKey held[] = {key(20), key(21), key(22)};
  REQUIRE(t.idx.read_lock(held));
  // c can take neither a's nor b's (each at its quota) nor its own (held).
  REQUIRE(t.put(30, t.c) == Index::Reserve::full);
  // a, at its quota, evicts its own.
  REQUIRE(t.put(31, t.a) == Index::Reserve::reserved);
  REQUIRE(t.book.used(t.a) == 4096);
  t.idx.read_unlock(held);
  REQUIRE(t.put(30, t.c) == Index::Reserve::reserved);
  REQUIRE(t.book.used(t.b) == 3072);
}

TEST_CASE("index: without quotas, tenants evict each other's objects in CLOCK order, as before tenants",
          "[tier][index]") {
  tier::TenantBook none;
  Index idx(4 * 1024, 1024);
  idx.set_tenants(&none);
  const tier::TenantId x = *none.id_of("x"), y = *none.id_of("y");
  for (int i = 0; i < 4; ++i) {
    std::uint32_t slot = 0;
    REQUIRE(idx.reserve(key(i), false, &slot, x) == Index::Reserve::reserved);
    idx.commit(key(i));
  }
  std::uint32_t slot = 0;
  REQUIRE(idx.reserve(key(9), false, &slot, y) == Index::Reserve::reserved);  // x's oldest goes
  const kv::ChunkKey first[] = {key(0)};
  REQUIRE(idx.present_run(first) == 0);
  REQUIRE(none.used(x) == 3 * 1024);
  REQUIRE(none.used(y) == 1024);
}

TEST_CASE("index: a tenant past its quota takes its own objects before what others hold beyond any quota",
          "[tier][index]") {
  Tenants t;
  for (int i = 0; i < 3; ++i) REQUIRE(t.put(i, t.c) == Index::Reserve::reserved);  // c: no quota, the oldest
  for (int i = 10; i < 17; ++i) REQUIRE(t.put(i, t.a) == Index::Reserve::reserved);  // a: 7 KiB, past its 4
  for (int i = 20; i < 30; ++i) REQUIRE(t.put(i, t.a) == Index::Reserve::reserved);
  for (int i = 0; i < 3; ++i) REQUIRE(t.has(i));  // the hand met c's first, and passed them by
  REQUIRE(t.book.evicted(t.c) == 0);
  // a's own all held: then c's, which no quota keeps.
  std::vector<kv::ChunkKey> mine;
  for (int i = 23; i < 30; ++i) mine.push_back(key(i));
  REQUIRE(t.idx.read_lock(mine));
  REQUIRE(t.put(40, t.a) == Index::Reserve::reserved);
  REQUIRE(t.book.evicted(t.c) == 1);
  t.idx.read_unlock(mine);
}

TEST_CASE("index: a tenant at exactly its quota takes its own objects for a new one, not another's", "[tier][index]") {
  Tenants t;
  for (int i = 0; i < 6; ++i) REQUIRE(t.put(i, t.c) == Index::Reserve::reserved);  // c: no quota, the oldest
  for (int i = 10; i < 14; ++i) REQUIRE(t.put(i, t.a) == Index::Reserve::reserved);  // a: exactly its 4 KiB
  REQUIRE(t.idx.free_slots() == 0);
  // One more of a's would pass its quota: one of its own goes, though the
  // hand meets c's first.
  REQUIRE(t.put(20, t.a) == Index::Reserve::reserved);
  REQUIRE(t.book.used(t.a) == 4096);
  REQUIRE(t.book.evicted(t.c) == 0);
  for (int i = 0; i < 6; ++i) REQUIRE(t.has(i));
}
