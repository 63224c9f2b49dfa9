// TierEvents: what the server announces of the objects of the indexes it
// watches (the arena's, the disk's), and what it holds for that: an
// object's description, held once for the object and its copy on another
// tier, dropped when its slot takes another object. The events' bytes:
// test_kv_event_codec; to a subscriber: tests/python/test_server_events.py.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <memory>
#include <string>

#include "object_fixtures.hpp"
#include "server/events/kv_event_codec.hpp"
#include "server/events/msgpack.hpp"
#include "server/events/tier_events.hpp"
#include "tier/size_classes.hpp"

using namespace kvstrand;
using server::DescriptionPool;
using tier::Index;

namespace {

constexpr std::uint64_t kSlab = 4096;
constexpr std::uint64_t kObject = 512;

kv::ChunkKey key(int i) { return test::key(static_cast<std::uint8_t>(i)); }

// Two watched tiers (arena "CPU", disk "DISK") and a publisher bound to a
// socket no one reads: what it announced is in its counters.
struct Rig {
  boost::asio::io_context io;
  std::shared_ptr<server::EventPublisher> publisher;
  std::unique_ptr<server::TierEvents> events;
  tier::SizeClasses arena{kSlab}, disk{kSlab};
  Index* a = nullptr;
  Index* d = nullptr;

  Rig() {
    server::EventOptions o;
    o.endpoint = "ipc:///tmp/kvstrand-test-tier-events-" + std::to_string(::getpid());
    auto p = server::EventPublisher::open(boost::asio::make_strand(io), o);
    REQUIRE(p.has_value());
    publisher = *p;
    events = std::make_unique<server::TierEvents>(publisher);
    events->watch(arena, "CPU");
    events->watch(disk, "DISK");
    for (std::uint32_t s = 0; s < 4; ++s) {
      arena.add_slab(s);
      disk.add_slab(s);
    }
    a = arena.index(kObject);
    d = disk.index(kObject);
    REQUIRE((a != nullptr && d != nullptr));
  }
  ~Rig() {
    events.reset();
    publisher.reset();  // never started: nothing to close on the strand
    ::unlink(("/tmp/kvstrand-test-tier-events-" + std::to_string(::getpid())).c_str());
  }
  std::uint32_t reserve(tier::SizeClasses& c, Index& idx, int k) {
    c.make_room(idx, 1);
    std::uint32_t slot = 0;
    REQUIRE(idx.reserve(key(k), false, &slot) == Index::Reserve::reserved);
    return slot;
  }
};

}  // namespace

TEST_CASE("a described object is announced at its commit and at its end, one without a description never",
          "[events]") {
  Rig r;
  const std::uint32_t described = r.reserve(r.arena, *r.a, 1);
  r.events->describe(*r.a, described, "chunk 1");
  r.reserve(r.arena, *r.a, 2);  // no description (an older client)
  CHECK(r.publisher->stats().stored == 0);  // not before its commit
  r.a->commit(key(1));
  r.a->commit(key(2));
  CHECK(r.publisher->stats().stored == 1);
  REQUIRE(r.a->erase(key(1)));
  REQUIRE(r.a->erase(key(2)));
  CHECK(r.publisher->stats().removed == 1);
}

TEST_CASE("an object and its copy on the disk hold one description, each announced on its medium", "[events]") {
  Rig r;
  const std::uint32_t as = r.reserve(r.arena, *r.a, 1);
  r.events->describe(*r.a, as, "chunk 1");
  r.a->commit(key(1));
  const std::uint32_t ds = r.reserve(r.disk, *r.d, 1);
  r.events->copy(*r.a, as, *r.d, ds);
  r.d->commit(key(1));
  CHECK(r.publisher->stats().stored == 2);
  const DescriptionPool& pool = r.events->descriptions();
  CHECK(pool.size() == 1);
  CHECK(r.events->description(*r.d, ds) == "chunk 1");
  // The same chunk saved again under another key: the same bytes, held once.
  const std::uint32_t again = r.reserve(r.arena, *r.a, 2);
  r.events->describe(*r.a, again, "chunk 1");
  r.a->commit(key(2));
  CHECK(pool.size() == 1);
  CHECK(pool.bytes() == 7);

  // The arena's objects leave and their slots take others: the disk's copy
  // keeps its description, and it alone holds it then.
  REQUIRE(r.a->erase(key(1)));
  REQUIRE(r.a->erase(key(2)));
  for (int k = 3; k < 3 + 2 * static_cast<int>(kSlab / kObject); ++k) r.reserve(r.arena, *r.a, k);
  CHECK(r.events->description(*r.a, as).empty());
  CHECK(r.events->description(*r.d, ds) == "chunk 1");
  CHECK(pool.size() == 1);
  REQUIRE(r.d->erase(key(1)));
  CHECK(r.publisher->stats().removed == 3);  // the arena's two, the disk's one
  for (int k = 1; k < 1 + 4 * static_cast<int>(kSlab / kObject); ++k) {
    r.disk.make_room(*r.d, 1);
    std::uint32_t slot = 0;
    if (r.d->reserve(key(k), false, &slot) != Index::Reserve::reserved) break;
  }
  CHECK(pool.size() == 0);  // every slot that held it took another object
  CHECK(pool.bytes() == 0);
}

TEST_CASE("objects stored before the events watched their index (a restarted server's) say nothing, asked, copied "
          "from or freed",
          "[events]") {
  boost::asio::io_context io;
  server::EventOptions o;
  o.endpoint = "ipc:///tmp/kvstrand-test-tier-events-before-" + std::to_string(::getpid());
  auto p = server::EventPublisher::open(boost::asio::make_strand(io), o);
  REQUIRE(p.has_value());
  tier::SizeClasses arena(kSlab), disk(kSlab);
  for (std::uint32_t s = 0; s < 4; ++s) {
    arena.add_slab(s);
    disk.add_slab(s);
  }
  // Stored, and described on the disk, before the arena is watched: the
  // events know the disk's slots and none of the arena's.
  Index& a = *arena.index(kObject);
  std::vector<std::uint32_t> slots;
  for (int k = 0; k < 4; ++k) {
    arena.make_room(a, 1);
    std::uint32_t slot = 0;
    REQUIRE(a.reserve(key(k), false, &slot) == Index::Reserve::reserved);
    a.commit(key(k));
    slots.push_back(slot);
  }
  {
    server::TierEvents events(*p);
    events.watch(disk, "DISK");
    Index& d = *disk.index(kObject);
    disk.make_room(d, 1);
    std::uint32_t ds = 0;
    REQUIRE(d.reserve(key(9), false, &ds) == Index::Reserve::reserved);
    events.describe(d, ds, "chunk 9");
    events.watch(arena, "CPU");
    for (const std::uint32_t s : slots) {
      CHECK(events.description(a, s).empty());
      events.copy(a, s, d, ds);  // nothing to copy: the disk's slot keeps its own
      CHECK(events.description(d, ds) == "chunk 9");
    }
    for (int k = 0; k < 4; ++k) REQUIRE(a.erase(key(k)));
    CHECK((*p)->stats().removed == 0);
    CHECK(events.descriptions().size() == 1);
  }
  ::unlink(o.endpoint.substr(6).c_str());
}

namespace {
// A 256-token chunk's description as kvstrand.vllm sends one (its 16 block
// hashes, its tokens): BlockStored needs all of it, BlockRemoved the hashes.
std::string chunk_description(int chunk) {
  server::msgpack::Writer w;
  w.map(5);
  w.str("block_hashes");
  w.array(16);
  for (int b = 0; b < 16; ++b) w.uint(static_cast<std::uint64_t>(chunk) << 32 | b);
  w.str("parent_block_hash");
  w.nil();
  w.str("token_ids");
  w.array(256);
  for (int t = 0; t < 256; ++t) w.uint(100000 + chunk * 256 + t);
  w.str("block_size");
  w.uint(16);
  w.str("group_idx");
  w.uint(0);
  return w.take();
}
}  // namespace

TEST_CASE("once announced and handed to the levels below, a slot keeps only what BlockRemoved says of its chunk",
          "[events]") {
  Rig r;
  const std::string whole = chunk_description(1);
  const std::string part = server::removal_part(whole).value();
  REQUIRE(part.size() * 4 < whole.size());
  const std::uint32_t as = r.reserve(r.arena, *r.a, 1);
  r.events->describe(*r.a, as, whole);
  // Not announced yet: nothing to keep apart from it.
  r.events->keep_removal_only(*r.a, {&as, 1});
  CHECK(r.events->description(*r.a, as) == whole);
  r.a->commit(key(1));
  CHECK(r.publisher->stats().stored == 1);
  // A level below writing it behind holds the whole one through the trim.
  const DescriptionPool::Id item = r.events->hold_whole(*r.a, as);
  REQUIRE(item != DescriptionPool::kNone);
  r.events->keep_removal_only(*r.a, {&as, 1});
  CHECK(r.events->description(*r.a, as) == part);
  CHECK(r.events->hold_whole(*r.a, as) == DescriptionPool::kNone);
  CHECK(r.events->text(item) == whole);
  // The disk's copy takes the item's, announced whole on its medium.
  const std::uint32_t ds = r.reserve(r.disk, *r.d, 1);
  r.events->copy(*r.a, as, *r.d, ds);  // a part is no description to copy
  CHECK(r.events->description(*r.d, ds).empty());
  r.events->describe(*r.d, ds, item);
  r.events->release(item);
  r.d->commit(key(1));
  CHECK(r.publisher->stats().stored == 2);
  r.events->keep_removal_only(*r.d, {&ds, 1});
  const DescriptionPool& pool = r.events->descriptions();
  CHECK(pool.size() == 1);  // the part alone, shared by both
  CHECK(pool.bytes() == part.size());
  // Their removals are still announced, from the part.
  REQUIRE(r.a->erase(key(1)));
  REQUIRE(r.d->erase(key(1)));
  CHECK(r.publisher->stats().removed == 2);
}
