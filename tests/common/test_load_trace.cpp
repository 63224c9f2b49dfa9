// common::LoadTrace (bench_transfer --trace): off, a load stamps nothing;
// on, a load passes every point, in the order each thread passes them.
#include <catch2/catch.hpp>

#include <cstdint>

#include "common/load_trace.hpp"
#include "connector_rig.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using common::LoadTrace;

namespace {

// A load of what save_spec("s", ...) stored, into other blocks, to its end.
void load_once(Rig& rig, const std::string& request, std::uint32_t first_block) {
  rig.conn->load(rig.load_spec(request, 1, 0, 2, Rig::block_range(first_block, 8), 3));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); }).loads[0].ok);
}

}  // namespace

TEST_CASE("load trace: off, a load stamps nothing, and on, it passes every point in order", "[connector]") {
  Rig rig;
  rig.conn->save(rig.save_spec("s", 1, 0, 2, Rig::block_range(0, 8)));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);

  REQUIRE_FALSE(LoadTrace::enabled());  // off unless a benchmark turns it on
  LoadTrace::clear();
  load_once(rig, "a", 16);
  for (int p = 0; p < LoadTrace::kPoints; ++p) {
    INFO(LoadTrace::name(static_cast<LoadTrace::Point>(p)));
    CHECK(LoadTrace::at(static_cast<LoadTrace::Point>(p)) == 0);
  }

  LoadTrace::enable(true);
  LoadTrace::clear();
  load_once(rig, "b", 24);
  LoadTrace::enable(false);
  // The engine's load() returns while the strand may have taken the load
  // already: `returned` is ordered after `called` only. Every other point
  // follows the one before (the strand's in its own order, the end taken
  // by finished() after the strand delivered it).
  std::int64_t before = 0;
  for (int p = 0; p < LoadTrace::kPoints; ++p) {
    const auto point = static_cast<LoadTrace::Point>(p);
    INFO(LoadTrace::name(point));
    const std::int64_t at = LoadTrace::at(point);
    CHECK(at != 0);
    CHECK(at >= before);
    if (point != LoadTrace::returned) before = at;
  }
}
