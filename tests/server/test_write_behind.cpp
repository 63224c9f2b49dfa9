// server::WriteBehind: the disk's and L2's queue of committed objects to
// write behind, each pinned in the arena until its bytes are taken.
#include <catch2/catch.hpp>

#include <memory>

#include "../tier/index_keys.hpp"
#include "server/events/description_pool.hpp"
#include "server/levels/write_behind.hpp"

using namespace kvstrand;
using kvstrand::test::key;
using server::WriteBehind;

namespace {
std::uint32_t committed(tier::Index& idx, int i) {
  std::uint32_t slot = 0;
  REQUIRE(idx.reserve(key(i), i % 2 == 0, &slot) == tier::Index::Reserve::reserved);
  idx.commit(key(i));
  return slot;
}
}  // namespace

TEST_CASE("write-behind: a queued object is pinned against eviction until done, in order", "[server][disk][l2]") {
  tier::Index idx(4 * 100, 100);
  WriteBehind q(8, UINT64_MAX);
  const std::uint32_t a = committed(idx, 1), b = committed(idx, 2);
  REQUIRE(q.push(idx, a) == WriteBehind::Push::queued);
  REQUIRE(q.push(idx, b) == WriteBehind::Push::queued);
  REQUIRE(idx.stats().pinned == 2);
  REQUIRE(q.bytes() == 200);
  const WriteBehind::Item first = q.take();
  REQUIRE(first.key == key(1));
  REQUIRE(first.slot == a);
  REQUIRE_FALSE(first.image);
  REQUIRE(q.size() == 1);
  // Taken but not done: still pinned, still counted.
  REQUIRE(idx.stats().pinned == 2);
  REQUIRE(q.bytes() == 200);
  q.done(first);
  REQUIRE(idx.stats().pinned == 1);
  REQUIRE(q.bytes() == 100);
  REQUIRE(q.take().image);  // key(2)'s image flag came with it
}

TEST_CASE("write-behind: past either bound nothing is pinned, and an uncommitted slot is not queued",
          "[server][disk][l2]") {
  tier::Index idx(8 * 100, 100);
  WriteBehind by_count(2, UINT64_MAX), by_bytes(8, 250);
  for (int i = 1; i <= 3; ++i) {
    const std::uint32_t s = committed(idx, i);
    REQUIRE(by_count.push(idx, s) == (i <= 2 ? WriteBehind::Push::queued : WriteBehind::Push::full));
    REQUIRE(by_bytes.push(idx, s) == (i <= 2 ? WriteBehind::Push::queued : WriteBehind::Push::full));
  }
  REQUIRE(idx.stats().pinned == 2);  // keys 1 and 2, twice each; key 3 never
  std::uint32_t writing = 0;
  REQUIRE(idx.reserve(key(9), false, &writing) == tier::Index::Reserve::reserved);
  WriteBehind q(8, UINT64_MAX);
  REQUIRE(q.push(idx, writing) == WriteBehind::Push::not_committed);
  REQUIRE(q.empty());
}

TEST_CASE("write-behind: a namespace drop and a close unpin what they take off the queue", "[server][disk][l2]") {
  tier::Index idx(8 * 100, 100);
  WriteBehind q(8, UINT64_MAX);
  kv::ChunkKey other = key(5);
  other.ns[0] ^= std::byte{0xff};  // another namespace
  std::uint32_t s_other = 0;
  REQUIRE(idx.reserve(other, false, &s_other) == tier::Index::Reserve::reserved);
  idx.commit(other);
  REQUIRE(q.push(idx, committed(idx, 1)) == WriteBehind::Push::queued);
  REQUIRE(q.push(idx, s_other) == WriteBehind::Push::queued);
  REQUIRE(q.push(idx, committed(idx, 2)) == WriteBehind::Push::queued);
  REQUIRE(q.drop_namespace(key(1).ns) == 2);
  REQUIRE(q.size() == 1);
  REQUIRE(q.items().front().key == other);
  REQUIRE(idx.stats().pinned == 1);
  REQUIRE(q.bytes() == 100);
  q.clear();
  REQUIRE(q.empty());
  REQUIRE(idx.stats().pinned == 0);
  REQUIRE(q.bytes() == 0);
}

TEST_CASE("write-behind: an item's description is held from its push to its done, a refused one's given back at once",
          "[server][disk][l2][events]") {
  tier::Index idx(8 * 100, 100);
  auto pool = std::make_shared<server::DescriptionPool>();
  WriteBehind q(2, UINT64_MAX);
  q.set_descriptions(pool);
  const server::DescriptionPool::Id d = pool->hold("chunk 1");  // the slot's own hold
  for (int i = 1; i <= 3; ++i) {
    pool->hold(d);  // what a level takes for its item (TierEvents::hold_whole)
    REQUIRE(q.push(idx, committed(idx, i), d) == (i <= 2 ? WriteBehind::Push::queued : WriteBehind::Push::full));
  }
  REQUIRE(pool->holders(d) == 3);  // the slot's, and two items'; the refused one's given back
  q.done(q.take());
  REQUIRE(pool->holders(d) == 2);
  REQUIRE(q.items().front().description == d);
  q.clear();
  REQUIRE(pool->holders(d) == 1);
  pool->release(d);
  REQUIRE(pool->size() == 0);
}
