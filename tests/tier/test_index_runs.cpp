// The index's runs of keys (a prefix looked up, leased, read-locked): each
// key is looked for first in the slot after the one before it, and the
// answer must be the table's wherever the chunks sit.
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "index_keys.hpp"
#include "tier/index.hpp"

using namespace kvstrand;
using kvstrand::test::key;
using tier::Index;

namespace {
std::uint32_t reserve_commit(Index& s, int i) {
  std::uint32_t slot = 0;
  REQUIRE(s.reserve(key(i), false, &slot) == Index::Reserve::reserved);
  s.commit(key(i));
  return slot;
}
}  // namespace

TEST_CASE("index: a prefix is found in any slot order, the slot after the chunk before only a first guess",
          "[tier][index]") {
  // key(i) has only hash bytes 0-1 set, so every one of these keys has the
  // same 32-bit table hash: only the whole key tells two apart.
  Index s(8 * 100, 100);
  for (int i : {3, 2, 1, 0}) reserve_commit(s, i);  // a prefix stored back to front
  const kv::ChunkKey prefix[] = {key(0), key(1), key(2), key(3)};
  REQUIRE(s.lookup(prefix, 16).tokens == 64);
  REQUIRE(s.present_run(prefix) == 4);
  const auto slots = s.read_lock(prefix);
  REQUIRE(slots);
  for (std::size_t i = 0; i < 4; ++i) REQUIRE(s.key_at((*slots)[i]) == prefix[i]);
  s.read_unlock(prefix);
  REQUIRE(s.stats().pinned == 0);

  // The slot after key(10)'s holds key(11), not key(12): same hash, another key.
  const std::uint32_t ten = reserve_commit(s, 10);
  REQUIRE(reserve_commit(s, 11) == ten + 1);
  const kv::ChunkKey other[] = {key(10), key(12)};
  REQUIRE(s.lookup(other, 16).tokens == 16);
  REQUIRE(s.present_run(other) == 1);
  REQUIRE_FALSE(s.read_lock(other));

  // A freed slot after it: its object is all zeros, as key(0) is, and not used.
  REQUIRE(s.erase(key(11)));
  const kv::ChunkKey zero_after[] = {key(10), key(0)};
  REQUIRE(s.lookup(zero_after, 16).tokens == 32);  // key(0) where it is stored, not in the freed slot
  const auto locked = s.read_lock(zero_after);
  REQUIRE(locked);
  REQUIRE(s.key_at((*locked)[1]) == key(0));
  REQUIRE((*locked)[1] != ten + 1);
  s.read_unlock(zero_after);
  REQUIRE(s.stats().pinned == 0);
}

TEST_CASE("index: a run whose chunk before sits in the last slot looks no further than the slots", "[tier][index]") {
  // Four slots exactly (the objects' vector sized to them): a look past the
  // last is a read past the vector's end (ASan's build reports it).
  Index s(4 * 100, 100);
  for (int i : {1, 2, 3, 0}) reserve_commit(s, i);
  const kv::ChunkKey ks[] = {key(0), key(1)};
  REQUIRE(s.lookup(ks, 16).tokens == 32);
  REQUIRE(s.present_run(ks) == 2);
  REQUIRE(s.read_lock(ks));
  s.read_unlock(ks);
}

TEST_CASE("index: a run of keys agrees with each key looked up alone, over saves, aborts, erases and evictions",
          "[tier][index]") {
  // Keys of two kinds: half share one table hash (hash bytes 0-1 only), half
  // spread over the table; saves of 1-24 keys in a row of a 48-key pool fill
  // 32 slots, so the layout a run is found in keeps changing, and runs of 24
  // are longer than the lookup's fetch-ahead (16 keys).
  std::vector<kv::ChunkKey> pool;
  for (int i = 0; i < 48; ++i) {
    kv::ChunkKey k = key(i + 1);
    if (i % 2) k.hash[4] = static_cast<std::byte>(0x40 + i);
    pool.push_back(k);
  }
  std::mt19937 rng(99);
  const auto next = [&rng] { return static_cast<std::size_t>(rng()); };
  for (int round = 0; round < 100; ++round) {
    Index s(32 * 100, 100);
    for (int op = 0; op < 60; ++op) {
      const std::size_t first = next() % pool.size();
      const std::size_t n = 1 + next() % 24;
      std::vector<kv::ChunkKey> run;
      for (std::size_t i = 0; i < n; ++i) run.push_back(pool[(first + i) % pool.size()]);
      switch (next() % 4) {
        case 0:
        case 1:  // a save, committed (evicting when full)
          s.commit(s.reserve(run, {}, 1).id, true);
          break;
        case 2:  // a save aborted
          s.commit(s.reserve(run, {}, 1).id, false);
          break;
        case 3: (void)s.erase(run.front()); break;
      }
      // Runs read in both directions from random keys of the pool.
      for (int probe = 0; probe < 4; ++probe) {
        std::vector<kv::ChunkKey> keys;
        const std::size_t at = next() % pool.size();
        const bool down = probe % 2;
        for (std::size_t i = 0; i < 24; ++i) keys.push_back(pool[(at + (down ? pool.size() - i : i)) % pool.size()]);
        std::size_t alone = 0;
        while (alone < keys.size() && s.absent(std::span(&keys[alone], 1)) == 0) ++alone;
        INFO("round " << round << ", op " << op << ", probe " << probe);
        REQUIRE(s.present_run(keys) == alone);
        REQUIRE(s.lookup(keys, 16).tokens == alone * 16);
        const auto slots = s.read_lock(std::span(keys).first(alone));
        REQUIRE(slots);
        for (std::size_t i = 0; i < alone; ++i) REQUIRE(s.key_at((*slots)[i]) == keys[i]);
        s.read_unlock(std::span(keys).first(alone));
        REQUIRE(s.stats().pinned == 0);
      }
    }
  }
}
