// DescriptionPool: one copy of each description however many hold it, freed
// with its last holder, and its open-addressed table right through churn
// (checked against a plain map of what should be held).
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "server/events/description_pool.hpp"

using kvstrand::server::DescriptionPool;

TEST_CASE("the same bytes are held once, counted, and freed with their last holder", "[events]") {
  DescriptionPool pool;
  const DescriptionPool::Id a = pool.hold("chunk a");
  const DescriptionPool::Id again = pool.hold(std::string("chunk a"));
  const DescriptionPool::Id b = pool.hold("chunk b");
  REQUIRE(a == again);
  REQUIRE(a != b);
  CHECK(pool.size() == 2);
  CHECK(pool.bytes() == 14);
  CHECK(pool.holders(a) == 2);
  CHECK(pool.at(a) == "chunk a");
  pool.hold(b);  // a copy's holder
  CHECK(pool.holders(b) == 2);
  pool.release(a);
  CHECK(pool.at(a) == "chunk a");
  pool.release(a);
  CHECK(pool.size() == 1);
  CHECK(pool.bytes() == 7);
  CHECK(pool.hold("chunk a") != DescriptionPool::kNone);
  CHECK(pool.at(b) == "chunk b");
}

TEST_CASE("nothing is held for an empty description, and kNone is nothing", "[events]") {
  DescriptionPool pool;
  CHECK(pool.hold("") == DescriptionPool::kNone);
  pool.hold(DescriptionPool::kNone);
  pool.release(DescriptionPool::kNone);
  CHECK(pool.at(DescriptionPool::kNone).empty());
  CHECK(pool.size() == 0);
}

TEST_CASE("through churn every held description is found by its bytes, and only those", "[events]") {
  // Few distinct strings, many holds and releases: runs in the table form,
  // break and wrap around, which is where a deletion can lose an entry.
  DescriptionPool pool;
  std::map<std::string, std::pair<DescriptionPool::Id, int>> want;  // bytes: id, holders
  std::mt19937 rng(7);
  for (int step = 0; step < 200000; ++step) {
    const std::string d = "description " + std::to_string(rng() % 3000);
    auto it = want.find(d);
    if (rng() % 2 == 0 || it == want.end()) {
      const DescriptionPool::Id id = pool.hold(d);
      if (it != want.end()) REQUIRE(id == it->second.first);
      auto& [held, n] = want[d];
      held = id;
      ++n;
    } else {
      pool.release(it->second.first);
      if (--it->second.second == 0) want.erase(it);
    }
  }
  REQUIRE(pool.size() == want.size());
  std::uint64_t bytes = 0;
  for (const auto& [d, held] : want) {
    REQUIRE(pool.at(held.first) == d);
    REQUIRE(pool.holders(held.first) == static_cast<std::uint32_t>(held.second));
    bytes += d.size();
    // Found by its bytes: holding it again gives its id.
    REQUIRE(pool.hold(d) == held.first);
    pool.release(held.first);
  }
  CHECK(pool.bytes() == bytes);
}
