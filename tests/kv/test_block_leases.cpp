// Leases on save sources and real block frees (F29), and the tail saves of
// finished requests (F2).
#include <catch2/catch.hpp>

#include <kvstrand/block_leases.hpp>
#include "kv/tail_saves.hpp"

using namespace kvstrand;
using kv::BlockId;
using kv::BlockLeases;

TEST_CASE("leases: a freed block returns to the pool only when its last lease is released (F29)", "[kv][lease]") {
  BlockLeases l;
  const std::vector<BlockId> a = {1, 2, 3}, b = {3, 4};
  const auto la = l.lease(a);
  const auto lb = l.lease(b);
  REQUIRE(l.free(9));             // never leased: straight back
  REQUIRE_FALSE(l.free(3));       // leased twice: not returned
  REQUIRE_FALSE(l.free(1));
  REQUIRE(l.release_would_free());
  REQUIRE(l.release(la) == std::vector<BlockId>{1});  // 3 is still pinned by lb; 2 was never freed
  REQUIRE(l.release(lb) == std::vector<BlockId>{3});
  REQUIRE_FALSE(l.release_would_free());
  REQUIRE(l.release(lb).empty());  // releasing twice returns nothing twice
  REQUIRE(l.live_leases() == 0);
}

TEST_CASE("leases: a release that frees nothing says so", "[kv][lease]") {
  BlockLeases l;
  const std::vector<BlockId> a = {5, 6};
  const auto id = l.lease(a);
  REQUIRE_FALSE(l.release_would_free());  // the engine still holds both blocks
  REQUIRE(l.release(id).empty());
  REQUIRE(l.free(5));
}

TEST_CASE("tail saves: a finished request's save keeps what it needs until taken or retired (F2)", "[kv][lease]") {
  BlockLeases leases;
  kv::TailSaves tails;
  const std::vector<BlockId> src = {10, 11, 12, 13};
  kv::TailSave s;
  s.tokens = {512, 768};
  s.keys.resize(1);
  s.sources = src;
  s.lease = leases.lease(src);
  tails.keep("req-1", s);
  // The request is gone; the engine frees its blocks. They stay pinned.
  for (BlockId b : src) REQUIRE_FALSE(leases.free(b));

  SECTION("dispatched later: everything it needs is still there") {
    auto taken = tails.take("req-1");
    REQUIRE(taken.has_value());
    REQUIRE(taken->sources == src);
    REQUIRE(taken->tokens == kv::TokenRange{512, 768});
    REQUIRE(tails.size() == 0);
    REQUIRE(leases.release(taken->lease) == src);  // source-safe: the blocks return
  }
  SECTION("retired explicitly: its lease is released and the blocks return") {
    REQUIRE(tails.retire("req-1", leases) == src);
    REQUIRE(leases.live_leases() == 0);
    REQUIRE(tails.retire("req-1", leases).empty());
  }
}
