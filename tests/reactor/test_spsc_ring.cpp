// The strand's hand-back of transfers' ends to the engine's thread: a
// bounded ring, one writer and one reader, that keeps order, never hands an
// item out twice and never writes over one not yet read.
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "reactor/spsc_ring.hpp"
#include "support.hpp"

using kvstrand::reactor::SpscRing;

TEST_CASE("spsc ring: holds its capacity (rounded up to a power of two) and refuses the next without writing it",
          "[reactor]") {
  SpscRing<int> ring(5);
  REQUIRE(ring.capacity() == 8);
  REQUIRE(ring.empty());
  for (int i = 0; i < 8; ++i) REQUIRE(ring.emplace([i](int& s) { s = i; }));
  bool called = false;
  REQUIRE_FALSE(ring.emplace([&](int&) { called = true; }));
  REQUIRE_FALSE(called);
  std::vector<int> got;
  REQUIRE(ring.consume([&](int& v) { got.push_back(v); }) == 8);
  REQUIRE(got == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  REQUIRE(ring.empty());
  REQUIRE(ring.emplace([](int& s) { s = 8; }));  // room again
}

TEST_CASE("spsc ring: peek leaves items, consume takes at most what it is told, in order", "[reactor]") {
  SpscRing<int> ring(8);
  for (int i = 0; i < 5; ++i) REQUIRE(ring.emplace([i](int& s) { s = i; }));
  std::vector<int> seen;
  REQUIRE(ring.peek([&](const int& v) { seen.push_back(v); }) == 5);
  REQUIRE(ring.peek([&](const int& v) { seen.push_back(v); }, 2) == 2);
  REQUIRE(seen == std::vector<int>{0, 1, 2, 3, 4, 0, 1});
  std::vector<int> got;
  REQUIRE(ring.consume([&](int& v) { got.push_back(v); }, 3) == 3);
  REQUIRE(ring.consume([&](int& v) { got.push_back(v); }) == 2);
  REQUIRE(got == std::vector<int>{0, 1, 2, 3, 4});
  REQUIRE(ring.consume([&](int&) { FAIL("nothing is left"); }) == 0);
}

TEST_CASE("spsc ring: a consumed item stays in its slot for the producer to write over", "[reactor]") {
  SpscRing<std::string> ring(1);
  REQUIRE(ring.emplace([](std::string& s) { s = "a string longer than the small-string buffer"; }));
  const char* buffer = nullptr;
  ring.consume([&](std::string& s) { buffer = s.data(); });
  std::string old;
  REQUIRE(ring.emplace([&](std::string& s) {
    old = s;
    s.assign("b");
  }));
  REQUIRE(old == "a string longer than the small-string buffer");
  ring.consume([&](std::string& s) {
    REQUIRE(s == "b");
    REQUIRE(s.data() == buffer);  // the same buffer, reused by the producer's thread
  });
}

TEST_CASE("spsc ring: an item whose consumer throws is not handed out again, and the ring goes on", "[reactor]") {
  SpscRing<int> ring(4);
  for (int i = 0; i < 3; ++i) REQUIRE(ring.emplace([i](int& s) { s = i; }));
  std::vector<int> got;
  REQUIRE_THROWS_AS(ring.consume([&](int& v) {
                      got.push_back(v);
                      if (v == 1) throw std::runtime_error("consumer");
                    }),
                    std::runtime_error);
  REQUIRE(ring.consume([&](int& v) { got.push_back(v); }) == 1);
  REQUIRE(got == std::vector<int>{0, 1, 2});
  for (int i = 0; i < 4; ++i) REQUIRE(ring.emplace([](int& s) { s = 0; }));  // every slot free again
}

TEST_CASE("spsc ring: two threads pass a million items in order, none lost or doubled", "[reactor]") {
  // Small, so that the producer meets a full ring and the consumer an
  // empty one many times; each item carries two words written apart, so a
  // slot read before its write is published shows.
  struct Item {
    std::uint64_t a = 0, b = 0;
  };
  SpscRing<Item> ring(16);
  constexpr std::uint64_t kItems = 1'000'000;
  std::thread producer([&] {
    for (std::uint64_t i = 1; i <= kItems;)
      if (ring.emplace([i](Item& s) {
            s.a = i;
            s.b = ~i;
          }))
        ++i;
  });
  std::uint64_t next = 1, torn = 0, out_of_order = 0;
  while (next <= kItems)
    ring.consume([&](Item& s) {
      torn += s.b != ~s.a;
      out_of_order += s.a != next;
      next = s.a + 1;
    });
  producer.join();
  REQUIRE(torn == 0);
  REQUIRE(out_of_order == 0);
  REQUIRE(ring.empty());
}
