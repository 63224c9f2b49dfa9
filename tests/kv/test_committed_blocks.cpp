// A save's source is the block committed under its hash now (F3).
#include <catch2/catch.hpp>

#include <kvstrand/committed_blocks.hpp>
#include <kvstrand/transfer_spec.hpp>

using namespace kvstrand;
using kv::BlockId;

namespace {
kv::Digest h(int i) {
  kv::Digest d{};
  d[0] = static_cast<std::byte>(i);
  return d;
}
}  // namespace

TEST_CASE("committed blocks: a failed load recomputed into other blocks is saved from those (F3)", "[kv][source]") {
  kv::CommittedBlocks c;
  kv::BlockLeases leases;
  const std::vector<kv::Digest> hashes = {h(1), h(2), h(3)};
  // A load will write hashes 1..3 into blocks 10..12.
  c.record_load(7, {{h(1), 10}, {h(2), 11}, {h(3), 12}});
  // Not landed yet: nothing can be saved from the destinations.
  REQUIRE_FALSE(c.save_sources(hashes).has_value());
  c.load_settled(7, false);  // the load failed
  REQUIRE_FALSE(c.save_sources(hashes).has_value());
  // The engine recomputes that prefix into blocks 20..22.
  c.commit(h(1), 20);
  c.commit(h(2), 21);
  c.commit(h(3), 22);
  auto spec = kv::build_save("req", {0, 48}, {}, hashes, true, c, leases);
  REQUIRE(spec.has_value());
  REQUIRE(spec->blocks == std::vector<BlockId>{20, 21, 22});
  // ...pinned for the transfer's life.
  for (BlockId b : spec->blocks) REQUIRE(leases.is_leased(b));
  REQUIRE_FALSE(leases.is_leased(10));
}

TEST_CASE("committed blocks: a landed load's destinations become the sources", "[kv][source]") {
  kv::CommittedBlocks c;
  c.record_load(1, {{h(1), 30}, {h(2), 31}});
  c.load_settled(1, true);
  const std::vector<kv::Digest> hashes = {h(1), h(2)};
  REQUIRE(c.save_sources(hashes) == std::vector<BlockId>{30, 31});
  // Evicted and recomputed elsewhere later: the new block is the source.
  c.evict(h(2));
  REQUIRE_FALSE(c.save_sources(hashes).has_value());
  c.commit(h(2), 40);
  REQUIRE(c.save_sources(hashes) == std::vector<BlockId>{30, 40});
}

TEST_CASE("committed blocks: no save and no lease when a source is missing", "[kv][source]") {
  kv::CommittedBlocks c;
  kv::BlockLeases leases;
  c.commit(h(1), 5);
  const std::vector<kv::Digest> hashes = {h(1), h(2)};
  REQUIRE_FALSE(kv::build_save("req", {0, 32}, {}, hashes, false, c, leases).has_value());
  REQUIRE(leases.live_leases() == 0);
  REQUIRE_FALSE(leases.is_leased(5));
}
