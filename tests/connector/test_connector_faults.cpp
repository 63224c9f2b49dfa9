// The Connector's entries of the failure catalogue (F1, F5, F10, F11, F13,
// F14, F17, F18, F23, F27), made to happen deterministically with the sim
// hooks and an index double.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_future.hpp>
#include <atomic>
#include <future>

#include "connector_rig.hpp"
#include "device/keep_for_process_life.hpp"
#include "faulty_index.hpp"
#include "device/pinned_buffer.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using connector::TransferState;
using kvstrand::FailStop;
using kvstrand::TransferErrc;
using kvstrand::TransferRefused;
namespace asio = boost::asio;

TEST_CASE("F1: a fence covers transfers in every state, and returns only when they are terminal", "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  for (const TransferState state : {TransferState::waiting_producer, TransferState::pending}) {
    INFO("state " << connector::to_string(state));
    Rig rig;
    auto producer = std::make_shared<device::Event>(must(device::Event::create()));
    device::Stream* held = &rig.engine_stream;
    if (state == TransferState::pending) held = &rig.save_stream();
    require_ok(device::sim::hold_stream(*held));
    require_ok(producer->record(rig.engine_stream));
    rig.conn->save(rig.save_spec("r", 1, 0, 2, Rig::block_range(0, 8)), producer);
    wait_for_state(*rig.conn, state);
    std::atomic<bool> released{false};
    std::thread releaser([&] {
      std::this_thread::sleep_for(50ms);
      released = true;
      (void)device::sim::release_stream(*held);
    });
    rig.conn->fence({"r"}, 10s);
    REQUIRE(released.load());  // it did not return while the save was live
    releaser.join();
    auto f = rig.conn->finished();
    REQUIRE(f.saves.size() == 1);  // terminal, and its outcome is there
    REQUIRE(f.saves[0].ok);
  }
}

TEST_CASE("F1: a fence sees a transfer posted just before it, still queued", "[reactor][gpu]") {
  if (!device_present()) return;
  // Submissions reach the strand through a ring it polls: with a reactor
  // that sleeps between calls (each submit wakes it) and with one that
  // keeps polling (no wake-up), the fence is ordered after the save.
  connector::ConnectorOptions o;
  SECTION("the reactor asleep at every submit") { o.reactor_idle_spin = 0us; }
  SECTION("the reactor polling between calls") { o.reactor_idle_spin = 1s; }
  Rig rig(o);
  for (int i = 0; i < 20; ++i) {
    rig.conn->save(rig.save_spec("q" + std::to_string(i), 100 + i, 0, 1, Rig::block_range(0, 4)));
    rig.conn->fence({"q" + std::to_string(i)}, 10s);  // posted after the save: sees it
    auto f = rig.conn->finished();
    REQUIRE(f.saves.size() == 1);
  }
}

TEST_CASE("F1 and F13: a fence timeout is fail-stop, raised on every later call", "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  Rig rig;
  require_ok(device::sim::hold_stream(rig.save_stream()));
  rig.conn->save(rig.save_spec("r", 1, 0, 1, Rig::block_range(0, 4)));
  try {
    rig.conn->fence({"r"}, 100ms);
    FAIL("the fence returned as if the save were done");
  } catch (const FailStop& e) {
    REQUIRE(e.code() == TransferErrc::fence_timeout);
    REQUIRE(std::string(e.what()).find("still live") != std::string::npos);
    REQUIRE(std::string(e.what()).find("restart") != std::string::npos);  // says what to do
  }
  for (int i = 0; i < 3; ++i) {
    REQUIRE_THROWS_AS(rig.conn->finished(), FailStop);
    REQUIRE_THROWS_AS(rig.conn->fence({"other"}, 1s), FailStop);
    REQUIRE_THROWS_AS(rig.conn->save(rig.save_spec("s", 2, 0, 1, Rig::block_range(4, 4))), FailStop);
  }
  require_ok(device::sim::release_stream(rig.save_stream()));
}

TEST_CASE("F23 and F13: a retrieve that never completes ends at its deadline, fail-stop for good", "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  Rig rig(with_deadline(150ms));
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  require_ok(device::sim::hold_stream(rig.load_stream()));
  rig.conn->load(rig.load_spec("a", 1, 0, 1, Rig::block_range(8, 4), 0));
  FailStop e = wait_for_fail_stop(*rig.conn);
  REQUIRE(e.code() == TransferErrc::deadline_exceeded);
  REQUIRE(std::string(e.what()).find("load of request 'a'") != std::string::npos);
  REQUIRE_THROWS_AS(rig.conn->finished(), FailStop);  // every call, not once
  REQUIRE_THROWS_AS(rig.conn->finished(), FailStop);
  auto live = rig.conn->transfers();
  REQUIRE(live.size() == 1);
  REQUIRE(live[0].past_deadline);  // still shown: its copy never ended
  REQUIRE(live[0].request == "a");   // with what it names: kept past its end, it reads its own copy of the spec
  REQUIRE(live[0].bytes > 0);
  require_ok(device::sim::release_stream(rig.load_stream()));
}

TEST_CASE("F13: close() counts the copies it never saw end, and the memory they read stays mapped",
          "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  {
    Rig rig(with_deadline(150ms));
    require_ok(device::sim::hold_stream(rig.save_stream()));
    rig.conn->save(rig.save_spec("late", 1, 0, 1, Rig::block_range(0, 4)));
    REQUIRE(wait_for_fail_stop(*rig.conn).code() == TransferErrc::deadline_exceeded);
    // Its copy runs, but only after close() has returned and the rig is gone:
    // the race an engine that freed its blocks at exit would lose.
    require_ok(device::sim::set_stream_delay(rig.save_stream(), 200ms));
    require_ok(device::sim::release_stream(rig.save_stream()));
    REQUIRE(rig.conn->never_ended() == 0);  // not closed yet
    rig.conn->close();
    REQUIRE(rig.conn->never_ended() == 1);
  }
  // The copy reads the rig's planes now: had they been freed, this segfaults.
  std::this_thread::sleep_for(400ms);
  // A close that saw every copy end frees the tier (its index plane, its
  // arena): only the stuck case above keeps it for the process's life.
  auto freed = std::make_shared<std::atomic<bool>>(false);
  connector::ConnectorOptions o;
  o.make_index = [freed](reactor::Reactor&) { return std::make_unique<NotedIndex>(freed); };
  Rig clean(o);
  clean.round_trip();
  REQUIRE_FALSE(freed->load());
  clean.conn->close();
  REQUIRE(clean.conn->never_ended() == 0);
  REQUIRE(freed->load());
}

// The coroutine form of a fence that times out: the co_await throws.
asio::awaitable<void> fence_held(Rig& rig, std::exception_ptr& thrown, bool& went_on) {
  std::vector<std::string> requests;
  requests.emplace_back("r");
  try {
    co_await rig.conn->async_fence(std::move(requests), 100ms, asio::use_awaitable);
    went_on = true;  // an engine here would reuse the blocks the save still reads
  } catch (...) {
    thrown = std::current_exception();
  }
}

TEST_CASE("F1 and F13: a coroutine fence that times out throws FailStop: it cannot be mistaken for done",
          "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  Rig rig;
  require_ok(device::sim::hold_stream(rig.save_stream()));
  rig.conn->save(rig.save_spec("r", 1, 0, 1, Rig::block_range(0, 4)));
  asio::io_context engine;
  std::exception_ptr thrown;
  bool went_on = false;
  asio::co_spawn(engine, fence_held(rig, thrown, went_on), asio::detached);
  engine.run();
  require_ok(device::sim::release_stream(rig.save_stream()));
  REQUIRE_FALSE(went_on);
  REQUIRE(thrown);
  try {
    std::rethrow_exception(thrown);
  } catch (const FailStop& e) {
    REQUIRE(e.code() == TransferErrc::fence_timeout);
  }
  // A fence on a closed connector throws too.
  rig.conn->close();
  std::exception_ptr after_close;
  went_on = false;
  asio::co_spawn(engine, fence_held(rig, after_close, went_on), asio::detached);
  engine.restart();
  engine.run();
  REQUIRE_FALSE(went_on);
  REQUIRE(after_close);
}

TEST_CASE("F23: a fail-stopped connector closes within close_bound while its copy is still wedged",
          "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  constexpr auto deadline = 150ms;
  const std::size_t kept_before = device::kept_for_process_life();
  Rig rig(with_deadline(deadline));
  require_ok(device::sim::hold_stream(rig.save_stream()));
  rig.conn->save(rig.save_spec("wedged", 1, 0, 1, Rig::block_range(0, 4)));
  REQUIRE(wait_for_fail_stop(*rig.conn).code() == TransferErrc::deadline_exceeded);
  // close() on another thread, so that a close that waits on the device
  // fails this test instead of hanging it.
  auto closing = std::async(std::launch::async, [&] { rig.conn->close(); });
  const bool in_bound = closing.wait_for(connector::close_bound(deadline) + 1s) == std::future_status::ready;
  // Let the copy run now (the tier's memory it writes was left allocated),
  // and wait for it to end before the rig frees the planes it reads.
  device::Stream& wedged = rig.save_stream();
  require_ok(device::sim::release_stream(wedged));
  closing.wait();
  REQUIRE(device::kept_for_process_life() > kept_before);  // the wedged copy's streams and memory
  while (wedged.query().code() == device::Errc::not_ready) std::this_thread::sleep_for(1ms);
  REQUIRE(in_bound);
}

TEST_CASE("F14: a stuck submit delays no other transfer's deadline or completion", "[reactor][fault]") {
  if (!device_present()) return;
  constexpr auto deadline = 300ms;
  auto stuck = std::make_shared<std::vector<kv::ChunkKey>>();
  Rig rig(over_faulty_index(with_deadline(deadline), FaultyIndex::Fault::hang, stuck));
  stuck->push_back(rig.keys(1, 0, 1).front());  // stuck-1's
  stuck->push_back(rig.keys(3, 0, 1).front());  // stuck-2's
  const auto posted_1 = std::chrono::steady_clock::now();
  rig.conn->save(rig.save_spec("stuck-1", 1, 0, 1, Rig::block_range(0, 4)));  // never returns
  rig.conn->save(rig.save_spec("fine", 2, 0, 1, Rig::block_range(4, 4)));
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  REQUIRE(f.saves[0].request == "fine");  // completed while the other is stuck
  REQUIRE(f.saves[0].ok);
  std::this_thread::sleep_for(100ms);
  // Posted while stuck-1 is live, so its deadline timer is started beside one.
  const auto posted_2 = std::chrono::steady_clock::now();
  rig.conn->save(rig.save_spec("stuck-2", 3, 0, 1, Rig::block_range(8, 4)));
  // The first stuck save's own deadline fires, though nothing it waits on ever returns.
  FailStop e = wait_for_fail_stop(*rig.conn);
  REQUIRE(std::chrono::steady_clock::now() - posted_1 >= deadline);
  REQUIRE(e.code() == TransferErrc::deadline_exceeded);
  REQUIRE(std::string(e.what()).find("'stuck-1'") != std::string::npos);
  // ...and the second one's too, on its own clock, after the fail-stop is
  // set. Found by its name: the snapshot lists live transfers first.
  auto failed = [&](const std::string& name) {
    for (const auto& t : rig.conn->transfers())
      if (t.request == name) return t.past_deadline;
    FAIL("transfer " << name << " is not shown");
    return false;
  };
  const auto end = posted_2 + 10s;
  while (!failed("stuck-2")) {
    INFO("stuck-2 never failed: its deadline timer is missing or did not fire");
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(1ms);
  }
  const auto took = std::chrono::steady_clock::now() - posted_2;
  INFO("stuck-2 failed " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                         << " ms after it was posted; its deadline is " << deadline.count() << " ms");
  REQUIRE(took >= deadline);      // not early: on its own clock, not stuck-1's
  REQUIRE(took < 10 * deadline);  // about one deadline (generous for sanitizer builds)
  REQUIRE(failed("stuck-1"));
}

TEST_CASE("connector: an exception escaping a transfer's coroutine fails that transfer with its cause, at once, "
          "and the transfers after it start clean",
          "[reactor][fault]") {
  if (!device_present()) return;
  auto throws = std::make_shared<std::vector<kv::ChunkKey>>();
  // A 60 s deadline: the failure must not wait for it.
  Rig rig(over_faulty_index(connector::ConnectorOptions{}, FaultyIndex::Fault::raise, throws));
  throws->push_back(rig.keys(1, 0, 1).front());
  rig.conn->save(rig.save_spec("throws", 1, 0, 1, Rig::block_range(0, 4)));
  rig.conn->save(rig.save_spec("fine", 2, 0, 1, Rig::block_range(4, 4)));
  kvstrand::Finished all;
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (all.saves.size() < 2) {
    INFO("a save that threw never ended: its exception was swallowed");
    REQUIRE(std::chrono::steady_clock::now() < end);
    auto f = rig.conn->finished();  // no fail-stop: the failure belongs to that transfer
    all.saves.insert(all.saves.end(), f.saves.begin(), f.saves.end());
    std::this_thread::sleep_for(1ms);
  }
  for (const auto& s : all.saves) {
    INFO(s.request << ": " << s.reason);
    if (s.request == "throws") {
      REQUIRE_FALSE(s.ok);
      REQUIRE(s.error == TransferErrc::device_error);
      REQUIRE(s.reason.find("injected: an index bug") != std::string::npos);
    } else {
      REQUIRE(s.ok);
    }
  }
  // The strand keeps ended transfers for its next starts (TransferTable::
  // keep_ended): these two may take the failed one's. Each must end on its
  // own account: ok, no reason, at once (a kept state would read as ended).
  for (int round = 0; round < 3; ++round) {
    rig.conn->save(rig.save_spec("next-a", 3 + 2 * round, 0, 1, Rig::block_range(8, 4)));
    rig.conn->save(rig.save_spec("next-b", 4 + 2 * round, 0, 1, Rig::block_range(12, 4)));
    const auto f = rig.wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 2; });
    REQUIRE(f.saves.size() == 2);
    for (const auto& s : f.saves) {
      INFO(s.request << ": " << s.reason);
      REQUIRE(s.ok);
      REQUIRE(s.reason.empty());
    }
  }
  REQUIRE(rig.conn->transfers().empty());
}

TEST_CASE("F14: an index that gives up at the deadline fails the transfer as the deadline's timer does, fail-stop "
          "included, whichever runs first",
          "[reactor][fault]") {
  if (!device_present()) return;
  auto late = std::make_shared<std::vector<kv::ChunkKey>>();
  // A 60 s deadline: the index's answer comes long before its timer.
  Rig rig(over_faulty_index(connector::ConnectorOptions{}, FaultyIndex::Fault::deadline, late));
  late->push_back(rig.keys(1, 0, 1).front());
  rig.conn->save(rig.save_spec("late", 1, 0, 1, Rig::block_range(0, 4)));
  FailStop e = wait_for_fail_stop(*rig.conn);
  REQUIRE(e.code() == TransferErrc::deadline_exceeded);
  INFO(e.what());
  REQUIRE(std::string(e.what()).find("'late'") != std::string::npos);
  // Its copy was never queued: nothing is kept waiting for it to end.
  REQUIRE(rig.conn->transfers().empty());
}

TEST_CASE("F5: a completion is observed with no new work arriving", "[reactor][sim]") {
  if (!sim_hooks_present()) return;
  Rig rig;
  require_ok(device::sim::set_stream_delay(rig.save_stream(), 30ms));  // past the poller's spin
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  // Nothing else is posted: only finished() reads are made.
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  REQUIRE(f.saves[0].ok);
  REQUIRE(rig.conn->poller_stats().timer_ticks > 0);
}

TEST_CASE("F17: a load completes while a continuous backlog of saves keeps arriving", "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  Rig rig({}, 512);
  rig.conn->save(rig.save_spec("base", 7, 0, 1, Rig::block_range(0, 4)));
  rig.conn->fence({"base"}, 10s);
  rig.conn->finished();
  // Saves now take 2 ms of stream time each and two arrive every step (a
  // 0.5 ms forward pass, longer on a loaded machine), so a backlog grows.
  // The load is posted once 20 saves are queued, however long that took.
  require_ok(device::sim::set_stream_delay(rig.save_stream(), 2ms));
  bool load_done = false, load_posted = false;
  int step = 0, saves_posted = 0, saves_done = 0, steps_after_load = -1, backlog_at_load = 0, backlog_at_done = 0;
  for (; step < 400 && !load_done; ++step) {
    std::vector<connector::Connector::Op> ops;
    for (int k = 0; k < 2; ++k, ++saves_posted)
      ops.push_back({kvstrand::TransferKind::save,
                     rig.save_spec("s" + std::to_string(saves_posted), 1000 + saves_posted, 0, 2,
                                   Rig::block_range((saves_posted % 7) * 8, 8)),  // never the load's 60..63
                     nullptr});
    if (!load_posted && saves_posted - saves_done >= 20) {
      ops.push_back({kvstrand::TransferKind::load, rig.load_spec("L", 7, 0, 1, Rig::block_range(60, 4), 9), nullptr});
      load_posted = true;
      backlog_at_load = saves_posted - saves_done;
    }
    rig.conn->submit(std::move(ops));
    std::this_thread::sleep_for(500us);  // the engine's forward pass
    auto f = rig.conn->finished();
    saves_done += static_cast<int>(f.saves.size());
    for (auto& l : f.loads) load_done = l.ok;
    if (load_posted) ++steps_after_load;
    if (load_done) backlog_at_done = saves_posted - saves_done;
  }
  INFO("load posted behind " << backlog_at_load << " queued saves, seen " << steps_after_load
                             << " steps later with " << backlog_at_done << " still queued");
  REQUIRE(load_posted);
  REQUIRE(load_done);
  // Seen with the backlog still there (it only grows: a load queued behind
  // the saves' copies, or a completion waiting for them to drain, would
  // never be seen), and within a bounded number of steps (a few on an idle
  // machine; the bound leaves room for a loaded one).
  REQUIRE(backlog_at_done >= 10);
  REQUIRE(steps_after_load <= 50);
  require_ok(device::sim::set_stream_delay(rig.save_stream(), 0us));
}

TEST_CASE("F18: the step thread never waits on the reactor unless it asks to", "[reactor][gpu]") {
  if (!device_present()) return;
  Rig rig;
  // An outcome already waiting in the mailbox, so that finished() below
  // takes its whole path (not only the nothing-new shortcut) while the
  // reactor is blocked. transfers() asks the strand: once it lists
  // nothing, the save's outcome has been delivered.
  rig.conn->save(rig.save_spec("c", 3, 0, 1, Rig::block_range(16, 4)));
  while (!rig.conn->transfers().empty()) std::this_thread::sleep_for(1ms);
  // Block the reactor thread itself until this test says so. The step
  // thread's calls run on a thread of their own: if save(), load(),
  // lookup() or finished() waited for the strand they would not return
  // while it is blocked, and the test fails instead of hanging (the gate
  // opens either way).
  std::promise<void> unblock;
  std::shared_future<void> gate = unblock.get_future().share();
  // The step starts only once the reactor is inside the gate: a handler
  // queued before it (the poller's idle spin) would otherwise drain the
  // step's submissions and answer them first.
  std::promise<void> inside;
  asio::post(rig.conn->reactor().strand(), [gate, &inside] {
    inside.set_value();
    gate.wait();
  });
  inside.get_future().wait();
  std::atomic<std::size_t> saves_seen{0};
  std::atomic<bool> other_seen{false};
  auto step = std::async(std::launch::async, [&] {
    rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
    rig.conn->load(rig.load_spec("b", 2, 0, 1, Rig::block_range(8, 4), 9));
    rig.conn->lookup(rig.keys(1, 0, 1));
    for (int i = 0; i < 100; ++i) {
      const auto f = rig.conn->finished();
      saves_seen += f.saves.size();
      if (!f.loads.empty() || !f.lookups.empty()) other_seen = true;
    }
  });
  const bool returned = step.wait_for(10s) == std::future_status::ready;
  unblock.set_value();
  step.get();
  REQUIRE(returned);  // with the reactor blocked
  REQUIRE(saves_seen == 1);  // c's, delivered before the block; nothing of the blocked strand's
  REQUIRE_FALSE(other_seen);
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 1 && f.loads.size() == 1; });
  REQUIRE(f.saves[0].ok);
}

TEST_CASE("F27: an object an in-flight load reads is never evicted for a save", "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  Rig rig({}, 4);  // room for 4 objects
  const auto before = rig.snapshot(Rig::block_range(0, 8), {1});
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));  // 2 objects
  rig.conn->save(rig.save_spec("b", 2, 0, 2, Rig::block_range(8, 8)));  // 2 more: full
  rig.wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 2; });
  require_ok(device::sim::hold_stream(rig.load_stream()));
  rig.conn->load(rig.load_spec("a", 1, 0, 2, Rig::block_range(40, 8), 5));  // reads a's objects
  wait_for_state(*rig.conn, TransferState::pending);
  rig.randomize(3);
  // Needs 4 objects: only b's 2 may be evicted; a's are being read.
  rig.conn->save(rig.save_spec("c", 3, 0, 4, Rig::block_range(16, 16)));
  require_ok(device::sim::release_stream(rig.load_stream()));
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 1 && f.loads.size() == 1; });
  REQUIRE(f.loads[0].ok);
  REQUIRE(rig.snapshot(Rig::block_range(40, 8), {5}) == before);  // a's bytes, intact
  REQUIRE_FALSE(f.saves[0].ok);
  REQUIRE(f.saves[0].error == TransferErrc::tier_full);
  REQUIRE(f.saves[0].reason.find("2 of 4 chunks refused") != std::string::npos);
  REQUIRE(rig.conn->tier_stats().evictions == 2);
}

TEST_CASE("F11: close with transfers in flight loses no completion and raises nothing", "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  SECTION("in flight") {
    Rig rig;
    rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
    rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
    require_ok(device::sim::set_stream_delay(rig.save_stream(), 20ms));
    require_ok(device::sim::set_stream_delay(rig.load_stream(), 20ms));
    rig.conn->save(rig.save_spec("b", 2, 0, 2, Rig::block_range(4, 8)));
    rig.conn->load(rig.load_spec("a", 1, 0, 1, Rig::block_range(20, 4), 9));  // slot 9: not a save's source
    rig.conn->close();
    rig.conn->close();  // idempotent
    auto f = rig.conn->finished();  // no FailStop: shutdown is no error
    REQUIRE(f.saves.size() == 1);
    REQUIRE(f.loads.size() == 1);
    REQUIRE(f.saves[0].ok);
    REQUIRE(f.loads[0].ok);
  }
  SECTION("before registration") {
    connector::Connector c;
    c.close();
    c.close();
    REQUIRE(c.finished().empty());
  }
}

TEST_CASE("F10: events come from the pool and are created on the reactor thread and none after warm-up", "[reactor][gpu]") {
  if (!device_present()) return;
  Rig rig;
  for (int i = 0; i < 50; ++i) {
    rig.conn->save(rig.save_spec("r" + std::to_string(i), 200 + i, 0, 1, Rig::block_range(0, 4)));
    rig.conn->fence({"r" + std::to_string(i)}, 10s);
    rig.conn->load(rig.load_spec("l" + std::to_string(i), 200 + i, 0, 1, Rig::block_range(8, 4), 0));
    rig.conn->fence({"l" + std::to_string(i)}, 10s);
    auto f = rig.conn->finished();
    REQUIRE(f.saves.size() == 1);
    REQUIRE(f.loads.size() == 1);
    REQUIRE(f.loads[0].ok);
  }
  const auto st = rig.conn->event_stats();
  INFO("created " << st.created << " acquired " << st.acquired);
  // One a save: a load's copies are followed by its copies-queued event
  // alone, which the poller awaits too (one record, not two).
  REQUIRE(st.acquired == 50);
  REQUIRE(st.created == 16);  // the warm-up, nothing since
  REQUIRE(st.in_use == 0);
  // The pool belongs to the reactor thread: this thread cannot take from it.
  auto denied = rig.conn->reactor().events().acquire();
  REQUIRE(denied.status().code() == device::Errc::wrong_executor);
}

