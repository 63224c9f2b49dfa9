// Save tracking per request (F19, F20): frontier, one save in flight, none
// while loading, the floor, one tier attempt, withdrawn promises.
#include <catch2/catch.hpp>

#include <kvstrand/load_outcome.hpp>
#include "kv/load_promise.hpp"
#include <kvstrand/save_tracker.hpp>

using namespace kvstrand;
using kv::LoadOutcome;
using kv::SaveTracker;
using kv::TokenRange;

TEST_CASE("save tracker: full committed chunks are saved one save at a time", "[kv][save]") {
  SaveTracker t(256);
  REQUIRE_FALSE(t.next_save(255).has_value());  // no full chunk yet
  auto s = t.next_save(700);
  REQUIRE(s == TokenRange{0, 512});
  REQUIRE_FALSE(t.next_save(1024).has_value());  // one in flight per request
  t.save_settled(true);
  REQUIRE(t.frontier() == 512);
  REQUIRE(t.next_save(1024) == TokenRange{512, 1024});
}

TEST_CASE("save tracker: a failed save leaves its range open, abandon closes it", "[kv][save]") {
  SaveTracker t(256);
  REQUIRE(t.next_save(512) == TokenRange{0, 512});
  t.save_settled(false);
  REQUIRE(t.frontier() == 0);
  REQUIRE(t.next_save(512) == TokenRange{0, 512});  // tried again
  t.save_settled(false);
  t.abandon(512);
  REQUIRE_FALSE(t.next_save(512).has_value());
}

TEST_CASE("save tracker: nothing is saved while the request loads", "[kv][save]") {
  SaveTracker t(256);
  t.load_decided({1024, 4096});
  REQUIRE(t.loading());
  REQUIRE_FALSE(t.next_save(4608).has_value());
  t.load_settled(LoadOutcome::landed);
  REQUIRE(t.next_save(4608) == TokenRange{4096, 4608});  // the loaded range is in the tier already
}

TEST_CASE("save tracker: every load that does not land reopens the range from the HBM hit to the tier hit (F19)", "[kv][save]") {
  for (LoadOutcome o : {LoadOutcome::tier_lost, LoadOutcome::withdrawn, LoadOutcome::failed}) {
    SaveTracker t(256);
    t.note_stored(4096);    // the lookup saw [0, 4096) in the tier
    t.load_decided({1024, 4096});  // HBM holds [0, 1024)
    REQUIRE(t.save_floor() == 1024u);
    t.load_settled(o);
    INFO("outcome " << static_cast<int>(o));
    REQUIRE(t.frontier() == 1024);
    REQUIRE(t.next_save(4352) == TokenRange{1024, 4352});
  }
}

TEST_CASE("save tracker: the floor is recorded once, at the first load decision", "[kv][save]") {
  SaveTracker t(256);
  t.load_decided({1024, 4096});
  t.load_settled(LoadOutcome::landed);
  t.load_decided({2048, 4096});  // a second decision must not move the floor
  REQUIRE(t.save_floor() == 1024u);
  t.load_settled(LoadOutcome::failed);
  REQUIRE(t.frontier() == 1024);
}

TEST_CASE("save tracker: one tier attempt per request", "[kv][save]") {
  SaveTracker t(256);
  REQUIRE_FALSE(t.tier_attempt_spent());
  t.load_decided({0, 768});
  REQUIRE(t.tier_attempt_spent());
  SaveTracker w(256);
  w.spend_tier_attempt();  // a withdrawn promise spends it too: no re-promise loop
  REQUIRE(w.tier_attempt_spent());
}

TEST_CASE("load outcomes: what each implies (F20)", "[kv][save]") {
  REQUIRE(kv::counts_as_transfer_failure(LoadOutcome::failed));
  REQUIRE_FALSE(kv::counts_as_transfer_failure(LoadOutcome::withdrawn));
  REQUIRE_FALSE(kv::counts_as_transfer_failure(LoadOutcome::tier_lost));
  REQUIRE(kv::frees_lookup_locks_directly(LoadOutcome::withdrawn));
  REQUIRE(kv::frees_lookup_locks_directly(LoadOutcome::tier_lost));
  REQUIRE_FALSE(kv::frees_lookup_locks_directly(LoadOutcome::failed));  // the retrieve's completion does
  REQUIRE_FALSE(kv::frees_lookup_locks_directly(LoadOutcome::landed));
  REQUIRE_FALSE(kv::reopens_saves(LoadOutcome::landed));
}

TEST_CASE("load promise: withdrawn after 50 undispatched steps, not before (F20)", "[kv][save]") {
  kv::LoadPromise p({0, 4096}, 77);
  for (int i = 0; i < 50; ++i) REQUIRE(p.step() == kv::LoadPromise::Verdict::waiting);
  REQUIRE(p.step() == kv::LoadPromise::Verdict::withdraw);
  REQUIRE(p.lookup_id() == 77);  // the locks to free directly

  kv::LoadPromise q({0, 4096}, 78, 5);
  REQUIRE(q.step() == kv::LoadPromise::Verdict::waiting);
  q.dispatch();
  for (int i = 0; i < 10; ++i) REQUIRE(q.step() == kv::LoadPromise::Verdict::dispatched);
}
