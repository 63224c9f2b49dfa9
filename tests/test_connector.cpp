// The Connector over LocalTier: round trips on random data, and the failure
// catalogue entries this module owns (F1, F5, F10, F11, F13, F14, F17, F18,
// F23, F27), made to happen deterministically with the sim hooks.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_future.hpp>
#include <atomic>
#include <future>

#include "connector_rig.hpp"
#include "hip/pinned_buffer.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using reactor::FailStop;
using reactor::TransferErrc;
using reactor::TransferRefused;
using reactor::TransferState;
namespace asio = boost::asio;

namespace {

reactor::ConnectorOptions with_deadline(std::chrono::milliseconds d) {
  reactor::ConnectorOptions o;
  o.transfer_deadline = d;
  return o;
}

bool has_state(reactor::Connector& c, TransferState s) {
  for (const auto& t : c.transfers())
    if (t.state == s) return true;
  return false;
}

void wait_for_state(reactor::Connector& c, TransferState s) {
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (!has_state(c, s)) {
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(200us);
  }
}

// A tier whose save of request "stuck" never returns (a submit that hangs:
// a server that stopped reading); everything else goes to LocalTier.
class StuckTier final : public reactor::Tier {
 public:
  StuckTier(reactor::Reactor& r, std::uint64_t bytes) : reactor_(r), inner_(r, bytes) {}
  asio::awaitable<reactor::Failure> attach(const reactor::Registration& reg) override { return inner_.attach(reg); }
  asio::awaitable<LookupResult> lookup(std::uint32_t reg, std::vector<kv::ChunkKey> keys) override {
    return inner_.lookup(reg, std::move(keys));
  }
  asio::awaitable<reactor::TierOutcome> save(reactor::TierJob job) override {
    if (job.spec.request.starts_with("stuck")) {
      asio::steady_timer forever(reactor_.strand(), std::chrono::hours(1));
      boost::system::error_code ec;
      co_await forever.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      reactor::TierOutcome cut;
      cut.error = std::make_error_code(std::errc::operation_canceled);
      co_return cut;
    }
    co_return co_await inner_.save(std::move(job));
  }
  asio::awaitable<reactor::TierOutcome> load(reactor::TierJob job) override {
    co_return co_await inner_.load(std::move(job));
  }
  tier::Index::Stats stats() const override { return inner_.stats(); }
  asio::awaitable<void> drain() override { co_return; }

 private:
  reactor::Reactor& reactor_;
  reactor::LocalTier inner_;
};

// A tier whose save of request "throws" throws out of its coroutine (a bug
// in a tier); everything else goes to LocalTier.
class ThrowingTier final : public reactor::Tier {
 public:
  ThrowingTier(reactor::Reactor& r, std::uint64_t bytes) : inner_(r, bytes) {}
  asio::awaitable<reactor::Failure> attach(const reactor::Registration& reg) override { return inner_.attach(reg); }
  asio::awaitable<LookupResult> lookup(std::uint32_t reg, std::vector<kv::ChunkKey> keys) override {
    return inner_.lookup(reg, std::move(keys));
  }
  asio::awaitable<reactor::TierOutcome> save(reactor::TierJob job) override {
    if (job.spec.request == "throws") throw std::runtime_error("injected: a tier bug");
    co_return co_await inner_.save(std::move(job));
  }
  asio::awaitable<reactor::TierOutcome> load(reactor::TierJob job) override {
    co_return co_await inner_.load(std::move(job));
  }
  tier::Index::Stats stats() const override { return inner_.stats(); }
  asio::awaitable<void> drain() override { co_return; }

 private:
  reactor::LocalTier inner_;
};

// One engine step as a coroutine on the engine's executor.
asio::awaitable<void> engine_step(Rig& rig, bool& fenced, std::thread::id& resumed_on) {
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  // (A braced list of strings inside a coroutine trips GCC 12: "array used
  // as initializer". Build it outside the co_await.)
  std::vector<std::string> requests;
  requests.emplace_back("a");
  co_await rig.conn->async_fence(std::move(requests), 10s, asio::use_awaitable);  // throws unless covered
  fenced = true;
  resumed_on = std::this_thread::get_id();
  // Then a save still in flight when the engine closes: async_close resumes
  // only once it settled.
  rig.conn->save(rig.save_spec("b", 2, 0, 2, Rig::block_range(8, 8)));
  std::error_code closed = co_await rig.conn->async_close(asio::use_awaitable);
  REQUIRE(!closed);
}

// Whether posting throws blocks_in_use.
template <class Post>
bool refused(Post&& post) {
  try {
    post();
  } catch (const TransferRefused& e) {
    return e.code() == TransferErrc::blocks_in_use;
  }
  return false;
}

}  // namespace

TEST_CASE("connector: save then evict then load into other blocks restores KV and state byte for byte", "[reactor][gpu]") {
  if (!device_present()) return;
  Rig rig;
  rig.round_trip();
}

TEST_CASE("connector: two groups of different block sizes are planned together and load byte for byte",
          "[reactor][gpu]") {
  if (!device_present()) return;
  Rig rig;
  rig.two_group_round_trip();
}

TEST_CASE("connector: each registration is its own pool: same block ids in two groups do not conflict, an unknown "
          "one is refused",
          "[reactor]") {
  if (!device_present() || !sim_hooks_present()) return;
  Rig rig;
  rig.add_swa_group();
  require_ok(hip::sim::hold_stream(rig.tier->save_stream()));
  rig.conn->save(rig.save_spec("a", 1, 0, 1, {0, 1, 2, 3}));
  // Block 0 of group 1 is another block than block 0 of group 0.
  kv::TransferSpec other;
  other.request = "b";
  other.registration = rig.swa->id;
  other.tokens = {0, 64};
  other.keys = rig.swa_keys(3, 1);
  other.blocks = {0, 1};
  rig.conn->load(other);
  kv::TransferSpec same = other;
  same.registration = 0;
  same.request = "c";
  same.keys = rig.keys(3, 0, 1);
  same.blocks = {0, 1, 2, 3};
  same.with_state = false;
  try {
    rig.conn->load(same);  // group 0's blocks 0..3 are being saved from
    FAIL("a load into blocks a live save reads was posted");
  } catch (const reactor::TransferRefused& e) {
    REQUIRE(e.code() == TransferErrc::blocks_in_use);
    REQUIRE(std::string(e.what()).find("registration 0") != std::string::npos);
  }
  same.registration = 2;
  try {
    rig.conn->load(same);
    FAIL("a spec naming no registration was posted");
  } catch (const reactor::TransferRefused& e) {
    REQUIRE(e.code() == TransferErrc::bad_spec);
    REQUIRE(std::string(e.what()).find("registration 2 does not exist") != std::string::npos);
  }
  REQUIRE_THROWS_AS(rig.conn->lookup(rig.keys(1, 0, 1), 2), reactor::TransferRefused);
  require_ok(hip::sim::release_stream(rig.tier->save_stream()));
  auto f = rig.wait_for([](const reactor::Finished& f) { return f.saves.size() == 1 && f.loads.size() == 1; });
  REQUIRE(f.saves[0].registration == 0);
  REQUIRE(f.loads[0].registration == rig.swa->id);
}

namespace {

// order_after_load(request) on the engine's stream, asked until the load's
// copies are queued (or 2 s have passed).
reactor::LoadOrder order_once_queued(Rig& rig, const std::string& request) {
  reactor::LoadOrder order = reactor::LoadOrder::not_queued_yet;
  for (int i = 0; i < 10000 && order == reactor::LoadOrder::not_queued_yet; ++i) {
    order = rig.conn->order_after_load(request, rig.engine_stream);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return order;
}

}  // namespace

TEST_CASE("connector: order_after_load makes the engine's stream wait on the device for the load's copies",
          "[reactor][sim]") {
  if (!device_present() || !sim_hooks_present()) return;
  Rig rig;
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  auto f = rig.wait_for([](const reactor::Finished& f) { return f.saves.size() == 1; });
  REQUIRE(f.saves[0].ok);
  const auto saved = rig.snapshot(Rig::block_range(0, 8), {1});
  rig.randomize(5);
  REQUIRE(rig.conn->order_after_load("a", rig.engine_stream) == reactor::LoadOrder::no_live_load);
  // The tier's load stream is held: the load's copies are queued, not run.
  require_ok(hip::sim::hold_stream(rig.tier->load_stream()));
  rig.conn->load(rig.load_spec("a", 1, 0, 2, Rig::block_range(20, 8), 9));
  REQUIRE(order_once_queued(rig, "a") == reactor::LoadOrder::ordered);
  // Work the engine queues now runs after the copies: a read of the
  // destination (pinned memory, so the read itself is asynchronous).
  const std::uint64_t n = 8 * Rig::kPlaneBlockBytes;
  auto host = must(hip::PinnedBuffer::allocate(n));
  require_ok(hip::copy_d2h(rig.engine_stream, host.data(), rig.planes[0].data() + 20 * Rig::kPlaneBlockBytes, n));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(rig.engine_stream.query().code() == hip::Errc::not_ready);  // waiting for the held copies
  require_ok(hip::sim::release_stream(rig.tier->load_stream()));
  require_ok(rig.engine_stream.synchronize());
  REQUIRE(std::vector<std::byte>(host.data(), host.data() + n) ==
          std::vector<std::byte>(saved.begin(), saved.begin() + static_cast<std::ptrdiff_t>(n)));
  f = rig.wait_for([](const reactor::Finished& f) { return f.loads.size() == 1; });
  REQUIRE(f.loads[0].ok);
  REQUIRE(rig.conn->order_after_load("a", rig.engine_stream) == reactor::LoadOrder::no_live_load);
}

TEST_CASE("connector: a load's copies-queued event is recorded for no other load before its end is drained",
          "[reactor][sim]") {
  if (!device_present() || !sim_hooks_present()) return;
  Rig rig;
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  rig.conn->save(rig.save_spec("b", 2, 0, 2, Rig::block_range(8, 8)));
  rig.wait_for([](const reactor::Finished& f) { return f.saves.size() == 2; });
  // a's load ends; its end waits, not drained.
  rig.conn->load(rig.load_spec("a", 1, 0, 2, Rig::block_range(20, 8), 9));
  for (int i = 0; i < 10000 && !rig.conn->finished_pending(); ++i)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  REQUIRE(rig.conn->finished_pending());
  // b's copies are queued and held; its event is recorded.
  require_ok(hip::sim::hold_stream(rig.tier->load_stream()));
  rig.conn->load(rig.load_spec("b", 2, 0, 2, Rig::block_range(30, 8), 10));
  REQUIRE(order_once_queued(rig, "b") == reactor::LoadOrder::ordered);
  // Ordering after a's load waits for a's copies, which have run: had b's
  // load been lent a's event, the engine's stream would wait for b's held
  // copies.
  auto probe = must(hip::Stream::create());
  REQUIRE(rig.conn->order_after_load("a", probe) == reactor::LoadOrder::ordered);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(probe.query().ok());
  require_ok(hip::sim::release_stream(rig.tier->load_stream()));
  auto f = rig.wait_for([](const reactor::Finished& f) { return f.loads.size() == 2; });
  REQUIRE(f.loads[0].ok);
  REQUIRE(f.loads[1].ok);
}

TEST_CASE("connector: a load starting mid-chunk (the HBM frontier) takes the right blocks", "[reactor][gpu]") {
  if (!device_present()) return;
  Rig rig;
  const auto src = Rig::block_range(0, 8);  // chunks 0 and 1
  const auto tail_before = rig.snapshot({4, 5, 6, 7}, {1});
  rig.conn->save(rig.save_spec("a", 3, 0, 2, src));
  rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); });
  rig.randomize(4);
  // HBM holds tokens [0, 96): load [96, 128) = the last two blocks of chunk 1.
  kv::TransferSpec s = rig.load_spec("a", 3, 1, 2, {30, 31}, 3);
  s.tokens = {96, 128};
  rig.conn->load(s);
  auto f = rig.wait_for([](const reactor::Finished& f) { return !f.loads.empty(); });
  REQUIRE(f.loads[0].ok);
  const auto after = rig.snapshot({30, 31}, {3});
  // Compare plane by plane: blocks 6 and 7 of the original, then the image.
  std::vector<std::byte> expect;
  const std::size_t B = Rig::kPlaneBlockBytes;
  for (int p = 0; p < 3; ++p)
    expect.insert(expect.end(), tail_before.begin() + (p * 4 + 2) * B, tail_before.begin() + (p * 4 + 4) * B);
  expect.insert(expect.end(), tail_before.end() - 512, tail_before.end());
  REQUIRE(after == expect);
}

TEST_CASE("connector: a stored key is not rewritten", "[reactor][gpu]") {
  if (!device_present()) return;
  Rig rig;
  const auto src = Rig::block_range(0, 4);
  const auto first = rig.snapshot(src, {0});
  rig.conn->save(rig.save_spec("a", 5, 0, 1, src));
  rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); });
  rig.randomize(6);
  rig.conn->save(rig.save_spec("b", 5, 0, 1, src));  // same key, other bytes
  auto f = rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); });
  REQUIRE(f.saves[0].ok);
  REQUIRE(f.saves[0].request == "b");
  REQUIRE(f.saves[0].blocks == src);  // a save's outcome names its source blocks
  rig.conn->load(rig.load_spec("c", 5, 0, 1, Rig::block_range(10, 4), 0));
  f = rig.wait_for([](const reactor::Finished& f) { return !f.loads.empty(); });
  REQUIRE(f.loads[0].ok);
  REQUIRE(rig.snapshot(Rig::block_range(10, 4), {0}) == first);
}

TEST_CASE("connector: a load of chunks the tier lacks fails with exactly its blocks", "[reactor][gpu]") {
  if (!device_present()) return;
  Rig rig;
  const auto dst = std::vector<kv::BlockId>{3, 1, 4, 15};
  rig.conn->load(rig.load_spec("x", 99, 0, 1, dst, 0));
  auto f = rig.wait_for([](const reactor::Finished& f) { return !f.loads.empty(); });
  REQUIRE_FALSE(f.loads[0].ok);
  REQUIRE(f.loads[0].error == TransferErrc::missing_chunk);
  REQUIRE(f.failed_loads().size() == 1);
  REQUIRE(f.failed_loads()[0]->blocks == dst);
  REQUIRE(rig.conn->finished().empty());  // a failure is reported once, as a completion
}

TEST_CASE("connector: refusals are typed and post nothing", "[reactor]") {
  if (!device_present()) return;
  SECTION("options") {
    REQUIRE_THROWS_WITH(reactor::Connector(with_deadline(0ms)), Catch::Contains("transfer_deadline"));
  }
  SECTION("before registration, duplicates, bad specs, after close") {
    reactor::Connector bare;
    Rig rig;
    try {
      bare.save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
      FAIL("accepted a save before registration");
    } catch (const TransferRefused& e) {
      REQUIRE(e.code() == TransferErrc::not_registered);
    }
    REQUIRE(rig.tier != nullptr);
    if (hip::sim::available()) {
      require_ok(hip::sim::hold_stream(rig.tier->save_stream()));
      require_ok(hip::sim::hold_stream(rig.tier->load_stream()));
    }
    rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
    try {
      rig.conn->save(rig.save_spec("a", 1, 1, 2, Rig::block_range(4, 4)));
      FAIL("accepted a duplicate save");
    } catch (const TransferRefused& e) {
      REQUIRE(e.code() == TransferErrc::duplicate_transfer);
    }
    rig.conn->load(rig.load_spec("a", 1, 0, 1, Rig::block_range(8, 4), 9));  // a load of it is another transfer
    try {
      rig.conn->save(rig.save_spec("b", 1, 0, 1, {0, 1, 2, 64}));  // block 64 is outside the pool
      FAIL("accepted a block outside the pool");
    } catch (const TransferRefused& e) {
      REQUIRE(e.code() == TransferErrc::bad_spec);
      REQUIRE(std::string(e.what()).find("block 64") != std::string::npos);
    }
    if (hip::sim::available()) {
      require_ok(hip::sim::release_stream(rig.tier->save_stream()));
      require_ok(hip::sim::release_stream(rig.tier->load_stream()));
    }
    rig.wait_for([](const reactor::Finished& f) { return f.saves.size() == 1 && f.loads.size() == 1; });
    rig.conn->save(rig.save_spec("a", 1, 1, 2, Rig::block_range(4, 4)));  // drained: no longer live
    rig.conn->close();
    REQUIRE_THROWS_AS(rig.conn->save(rig.save_spec("c", 1, 0, 1, Rig::block_range(0, 4))), TransferRefused);
  }
}

TEST_CASE("F1: a fence covers transfers in every state, and returns only when they are terminal", "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  for (const TransferState state : {TransferState::waiting_producer, TransferState::pending}) {
    INFO("state " << reactor::to_string(state));
    Rig rig;
    auto producer = std::make_shared<hip::Event>(must(hip::Event::create()));
    hip::Stream* held = &rig.engine_stream;
    if (state == TransferState::pending) held = &rig.tier->save_stream();
    require_ok(hip::sim::hold_stream(*held));
    require_ok(producer->record(rig.engine_stream));
    rig.conn->save(rig.save_spec("r", 1, 0, 2, Rig::block_range(0, 8)), producer);
    wait_for_state(*rig.conn, state);
    std::atomic<bool> released{false};
    std::thread releaser([&] {
      std::this_thread::sleep_for(50ms);
      released = true;
      (void)hip::sim::release_stream(*held);
    });
    rig.conn->fence({"r"}, 10s);
    REQUIRE(released.load());  // it did not return while the save was live
    releaser.join();
    auto f = rig.conn->finished();
    REQUIRE(f.saves.size() == 1);  // terminal, and its outcome is there
    REQUIRE(f.saves[0].ok);
  }
}

TEST_CASE("connector: the producer event may be recorded again on its stream, and dropped, right after submit",
          "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  Rig rig;
  const auto src = Rig::block_range(0, 8);
  auto producer = std::make_shared<hip::Event>(must(hip::Event::create()));
  require_ok(hip::sim::hold_stream(rig.engine_stream));  // the engine's forward has not run yet
  require_ok(producer->record(rig.engine_stream));
  rig.conn->save(rig.save_spec("r", 1, 0, 2, src), producer);
  wait_for_state(*rig.conn, TransferState::waiting_producer);
  require_ok(producer->record(rig.engine_stream));  // the next step records it again: allowed
  producer.reset();  // and the engine lets go of it: the Connector still holds it (ASan: no use after free)
  std::this_thread::sleep_for(20ms);
  REQUIRE(rig.conn->transfers().size() == 1);  // still waiting for the engine's stream
  require_ok(hip::sim::release_stream(rig.engine_stream));
  auto f = rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); });
  REQUIRE(f.saves[0].ok);
}

TEST_CASE("connector: the producer event is let go once seen complete, not kept by the submission ring",
          "[reactor][gpu]") {
  if (!device_present()) return;
  Rig rig;
  auto producer = std::make_shared<hip::Event>(must(hip::Event::create()));
  require_ok(producer->record(rig.engine_stream));
  rig.conn->save(rig.save_spec("r", 1, 0, 1, Rig::block_range(0, 4)), producer);
  auto f = rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); });
  REQUIRE(f.saves[0].ok);
  // The strand dropped it when it saw it complete; the ring's slot, reused
  // only after 255 more submits, holds no reference either: an engine that
  // pools its events sees this one free again.
  REQUIRE(producer.use_count() == 1);
}

TEST_CASE("F1: a fence sees a transfer posted just before it, still queued", "[reactor][gpu]") {
  if (!device_present()) return;
  // Submissions reach the strand through a ring it polls: with a reactor
  // that sleeps between calls (each submit wakes it) and with one that
  // keeps polling (no wake-up), the fence is ordered after the save.
  reactor::ConnectorOptions o;
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

TEST_CASE("connector: a batch submitted to a sleeping reactor is taken with nothing else to wake it",
          "[reactor][gpu]") {
  if (!device_present()) return;
  // submit() puts a batch into the ring and checks once, at its end, whether
  // the reactor sleeps: nothing but that check wakes it here (finished()
  // only reads).
  reactor::ConnectorOptions o;
  o.reactor_idle_spin = 0us;
  Rig rig(o);
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(5ms);  // the reactor is asleep again
    std::vector<reactor::Connector::Op> ops;
    for (int i = 0; i < 3; ++i)
      ops.push_back({reactor::TransferKind::save,
                     rig.save_spec("b" + std::to_string(round * 3 + i), 200 + round * 3 + i, 0, 1,
                                   Rig::block_range(static_cast<std::uint32_t>(4 * i), 4)),
                     nullptr});
    rig.conn->submit(std::move(ops));
    auto f = rig.wait_for([](const reactor::Finished& f) { return f.saves.size() == 3; });
    for (const auto& s : f.saves) REQUIRE(s.ok);
  }
}

TEST_CASE("connector: more ends than the ring holds wait behind it, none lost, each once", "[reactor][gpu]") {
  if (!device_present()) return;
  // Every save ends before the engine drains any: the mailbox's ring fills
  // and the rest wait behind its lock.
  Rig rig;
  const int n = static_cast<int>(reactor::Mailbox::kEndSlots) + 44;
  std::vector<reactor::Connector::Op> ops;
  std::vector<std::string> requests;
  for (int i = 0; i < n; ++i) {
    requests.push_back("o" + std::to_string(i));
    ops.push_back({reactor::TransferKind::save,
                   rig.save_spec(requests.back(), 1000 + i, 0, 1, Rig::block_range(0, 4)), nullptr});
  }
  rig.conn->submit(std::move(ops));
  rig.conn->fence(requests, 10s);  // every one has ended
  auto f = rig.conn->finished();
  std::set<std::string> ended;
  for (const auto& s : f.saves) ended.insert(s.request);
  REQUIRE(f.saves.size() == static_cast<std::size_t>(n));
  REQUIRE(ended.size() == static_cast<std::size_t>(n));
  REQUIRE(rig.conn->finished().saves.empty());
  // The ring goes on after it: the next one ends through it.
  rig.conn->save(rig.save_spec("after", 5000, 0, 1, Rig::block_range(0, 4)));
  f = rig.wait_for([](const reactor::Finished& f) { return f.saves.size() == 1; });
  REQUIRE(f.saves[0].request == "after");
}

TEST_CASE("F1 and F13: a fence timeout is fail-stop, raised on every later call", "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  Rig rig;
  require_ok(hip::sim::hold_stream(rig.tier->save_stream()));
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
  require_ok(hip::sim::release_stream(rig.tier->save_stream()));
}

TEST_CASE("F23 and F13: a retrieve that never completes ends at its deadline, fail-stop for good", "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  Rig rig(with_deadline(150ms));
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); });
  require_ok(hip::sim::hold_stream(rig.tier->load_stream()));
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
  require_ok(hip::sim::release_stream(rig.tier->load_stream()));
}

TEST_CASE("F13: close() counts the copies it never saw end, and the memory they read stays mapped",
          "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  {
    Rig rig(with_deadline(150ms));
    require_ok(hip::sim::hold_stream(rig.tier->save_stream()));
    rig.conn->save(rig.save_spec("late", 1, 0, 1, Rig::block_range(0, 4)));
    REQUIRE(wait_for_fail_stop(*rig.conn).code() == TransferErrc::deadline_exceeded);
    // Its copy runs, but only after close() has returned and the rig is gone:
    // the race an engine that freed its blocks at exit would lose.
    require_ok(hip::sim::set_stream_delay(rig.tier->save_stream(), 200ms));
    require_ok(hip::sim::release_stream(rig.tier->save_stream()));
    REQUIRE(rig.conn->never_ended() == 0);  // not closed yet
    rig.conn->close();
    REQUIRE(rig.conn->never_ended() == 1);
  }
  // The copy reads the rig's planes now: had they been freed, this segfaults.
  std::this_thread::sleep_for(400ms);
  Rig clean;
  clean.round_trip();
  clean.conn->close();
  REQUIRE(clean.conn->never_ended() == 0);
}

TEST_CASE("connector: a device the reactor cannot select is refused at construction, naming it", "[reactor]") {
  if (!device_present()) return;
  reactor::ConnectorOptions o;
  o.device = 4096;
  try {
    reactor::Connector c(o);
    FAIL("a connector was made for a device that does not exist");
  } catch (const std::invalid_argument& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find("device") != std::string::npos);
    REQUIRE(std::string(e.what()).find("4096") != std::string::npos);
  }
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
  require_ok(hip::sim::hold_stream(rig.tier->save_stream()));
  rig.conn->save(rig.save_spec("r", 1, 0, 1, Rig::block_range(0, 4)));
  asio::io_context engine;
  std::exception_ptr thrown;
  bool went_on = false;
  asio::co_spawn(engine, fence_held(rig, thrown, went_on), asio::detached);
  engine.run();
  require_ok(hip::sim::release_stream(rig.tier->save_stream()));
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
  Rig rig(with_deadline(deadline));
  require_ok(hip::sim::hold_stream(rig.tier->save_stream()));
  rig.conn->save(rig.save_spec("wedged", 1, 0, 1, Rig::block_range(0, 4)));
  REQUIRE(wait_for_fail_stop(*rig.conn).code() == TransferErrc::deadline_exceeded);
  // close() on another thread, so that a close that waits on the device
  // fails this test instead of hanging it.
  auto closing = std::async(std::launch::async, [&] { rig.conn->close(); });
  const bool in_bound = closing.wait_for(reactor::close_bound(deadline) + 1s) == std::future_status::ready;
  // Let the copy run now (the tier's memory it writes was left allocated),
  // and wait for it to end before the rig frees the planes it reads.
  hip::Stream& wedged = rig.tier->save_stream();
  require_ok(hip::sim::release_stream(wedged));
  closing.wait();
  while (wedged.query().code() == hip::Errc::not_ready) std::this_thread::sleep_for(1ms);
  REQUIRE(in_bound);
}

TEST_CASE("F14: a stuck submit delays no other transfer's deadline or completion", "[reactor][fault]") {
  if (!device_present()) return;
  constexpr auto deadline = 300ms;
  reactor::ConnectorOptions opts = with_deadline(deadline);
  opts.make_tier = [](reactor::Reactor& r) { return std::make_unique<StuckTier>(r, 64ull << 20); };
  Rig rig(opts);
  const auto posted_1 = std::chrono::steady_clock::now();
  rig.conn->save(rig.save_spec("stuck-1", 1, 0, 1, Rig::block_range(0, 4)));  // never returns
  rig.conn->save(rig.save_spec("fine", 2, 0, 1, Rig::block_range(4, 4)));
  auto f = rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); });
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

TEST_CASE("connector: an exception escaping a transfer's coroutine fails that transfer with its cause, at once",
          "[reactor][fault]") {
  if (!device_present()) return;
  reactor::ConnectorOptions opts;  // a 60 s deadline: the failure must not wait for it
  opts.make_tier = [](reactor::Reactor& r) { return std::make_unique<ThrowingTier>(r, 64ull << 20); };
  Rig rig(opts);
  rig.conn->save(rig.save_spec("throws", 1, 0, 1, Rig::block_range(0, 4)));
  rig.conn->save(rig.save_spec("fine", 2, 0, 1, Rig::block_range(4, 4)));
  reactor::Finished all;
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
      REQUIRE(s.reason.find("injected: a tier bug") != std::string::npos);
    } else {
      REQUIRE(s.ok);
    }
  }
  REQUIRE(rig.conn->transfers().empty());
}

TEST_CASE("connector: max_live_transfers and max_live_lookups refuse what would pass them, posting nothing",
          "[reactor][sim]") {
  if (!sim_hooks_present()) return;
  reactor::ConnectorOptions opts;
  opts.max_live_transfers = 3;
  opts.max_live_lookups = 1;
  Rig rig(opts);
  require_ok(hip::sim::hold_stream(rig.tier->save_stream()));
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  rig.conn->save(rig.save_spec("b", 2, 0, 1, Rig::block_range(4, 4)));
  std::vector<reactor::Connector::Op> two;
  two.push_back({reactor::TransferKind::save, rig.save_spec("c", 3, 0, 1, Rig::block_range(8, 4)), nullptr});
  two.push_back({reactor::TransferKind::save, rig.save_spec("d", 4, 0, 1, Rig::block_range(12, 4)), nullptr});
  try {
    rig.conn->submit(std::move(two));
    FAIL("a batch past max_live_transfers was posted");
  } catch (const TransferRefused& e) {
    REQUIRE(e.code() == TransferErrc::too_many_live);
    REQUIRE(std::string(e.what()).find("max_live_transfers") != std::string::npos);
  }
  REQUIRE(rig.conn->transfers().size() == 2);  // neither of the batch was posted
  rig.conn->save(rig.save_spec("c", 3, 0, 1, Rig::block_range(8, 4)));  // the third fits
  rig.conn->lookup(rig.keys(9, 0, 1));
  REQUIRE_THROWS_AS(rig.conn->lookup(rig.keys(9, 0, 1)), TransferRefused);
  require_ok(hip::sim::release_stream(rig.tier->save_stream()));
  // Drained, there is room again.
  rig.wait_for([](const reactor::Finished& f) { return f.saves.size() == 3 && f.lookups.size() == 1; });
  rig.conn->save(rig.save_spec("d", 4, 0, 1, Rig::block_range(12, 4)));
  rig.conn->lookup(rig.keys(9, 0, 1));
}

TEST_CASE("connector: a save and a load of the same blocks at once are refused (blocks_in_use), never interleaved",
          "[reactor][sim]") {
  if (!sim_hooks_present()) return;
  Rig rig;
  rig.conn->save(rig.save_spec("stored", 1, 0, 1, Rig::block_range(0, 4)));
  rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); });
  require_ok(hip::sim::hold_stream(rig.tier->save_stream()));
  require_ok(hip::sim::hold_stream(rig.tier->load_stream()));
  rig.conn->load(rig.load_spec("in", 1, 0, 1, Rig::block_range(8, 4), 9));  // writes 8..11 and image slot 9
  rig.conn->save(rig.save_spec("out", 2, 0, 1, Rig::block_range(16, 4)));   // reads 16..19 and image slot 0
  REQUIRE(refused([&] { rig.conn->save(rig.save_spec("a", 3, 0, 1, {20, 21, 22, 11})); }));  // 11 is being loaded
  REQUIRE(refused([&] { rig.conn->load(rig.load_spec("b", 1, 0, 1, {30, 31, 32, 19}, 1)); }));  // 19 is being saved
  REQUIRE(refused([&] { rig.conn->load(rig.load_spec("c", 1, 0, 1, {8, 40, 41, 42}, 1)); }));  // 8: two loads
  REQUIRE(refused([&] { rig.conn->load(rig.load_spec("g", 1, 0, 1, Rig::block_range(52, 4), 0)); }));  // slot 0 is read
  auto h = rig.save_spec("h", 6, 0, 1, Rig::block_range(56, 4));
  h.state_slots = {9};  // slot 9 is being loaded into
  REQUIRE(refused([&] { rig.conn->save(h); }));
  std::vector<reactor::Connector::Op> batch;  // within one batch too, and nothing of it is posted
  batch.push_back({reactor::TransferKind::save, rig.save_spec("d", 4, 0, 1, Rig::block_range(48, 4)), nullptr});
  batch.push_back({reactor::TransferKind::load, rig.load_spec("e", 1, 0, 1, Rig::block_range(48, 4), 2), nullptr});
  REQUIRE(refused([&] { rig.conn->submit(std::move(batch)); }));
  rig.conn->save(rig.save_spec("f", 5, 0, 1, Rig::block_range(16, 4)));  // two saves may read the same blocks
  REQUIRE(rig.conn->transfers().size() == 3);
  require_ok(hip::sim::release_stream(rig.tier->save_stream()));
  require_ok(hip::sim::release_stream(rig.tier->load_stream()));
  rig.wait_for([](const reactor::Finished& f) { return f.saves.size() == 2 && f.loads.size() == 1; });
  rig.conn->save(rig.save_spec("a", 3, 0, 1, {20, 21, 22, 11}));  // drained: the blocks are free again
}

TEST_CASE("F5: a completion is observed with no new work arriving", "[reactor][sim]") {
  if (!sim_hooks_present()) return;
  Rig rig;
  require_ok(hip::sim::set_stream_delay(rig.tier->save_stream(), 30ms));  // past the poller's spin
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  // Nothing else is posted: only finished() reads are made.
  auto f = rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); });
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
  require_ok(hip::sim::set_stream_delay(rig.tier->save_stream(), 2ms));
  bool load_done = false, load_posted = false;
  int step = 0, saves_posted = 0, saves_done = 0, steps_after_load = -1, backlog_at_load = 0, backlog_at_done = 0;
  for (; step < 400 && !load_done; ++step) {
    std::vector<reactor::Connector::Op> ops;
    for (int k = 0; k < 2; ++k, ++saves_posted)
      ops.push_back({reactor::TransferKind::save,
                     rig.save_spec("s" + std::to_string(saves_posted), 1000 + saves_posted, 0, 2,
                                   Rig::block_range((saves_posted % 7) * 8, 8)),  // never the load's 60..63
                     nullptr});
    if (!load_posted && saves_posted - saves_done >= 20) {
      ops.push_back({reactor::TransferKind::load, rig.load_spec("L", 7, 0, 1, Rig::block_range(60, 4), 9), nullptr});
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
  require_ok(hip::sim::set_stream_delay(rig.tier->save_stream(), 0us));
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
  auto f = rig.wait_for([](const reactor::Finished& f) { return f.saves.size() == 1 && f.loads.size() == 1; });
  REQUIRE(f.saves[0].ok);
}

TEST_CASE("F27: an object an in-flight load reads is never evicted for a save", "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  Rig rig({}, 4);  // room for 4 objects
  const auto before = rig.snapshot(Rig::block_range(0, 8), {1});
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));  // 2 objects
  rig.conn->save(rig.save_spec("b", 2, 0, 2, Rig::block_range(8, 8)));  // 2 more: full
  rig.wait_for([](const reactor::Finished& f) { return f.saves.size() == 2; });
  require_ok(hip::sim::hold_stream(rig.tier->load_stream()));
  rig.conn->load(rig.load_spec("a", 1, 0, 2, Rig::block_range(40, 8), 5));  // reads a's objects
  wait_for_state(*rig.conn, TransferState::pending);
  rig.randomize(3);
  // Needs 4 objects: only b's 2 may be evicted; a's are being read.
  rig.conn->save(rig.save_spec("c", 3, 0, 4, Rig::block_range(16, 16)));
  require_ok(hip::sim::release_stream(rig.tier->load_stream()));
  auto f = rig.wait_for([](const reactor::Finished& f) { return f.saves.size() == 1 && f.loads.size() == 1; });
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
    rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); });
    require_ok(hip::sim::set_stream_delay(rig.tier->save_stream(), 20ms));
    require_ok(hip::sim::set_stream_delay(rig.tier->load_stream(), 20ms));
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
    reactor::Connector c;
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
  REQUIRE(st.acquired >= 100);
  REQUIRE(st.created == 16);  // the warm-up, nothing since
  REQUIRE(st.in_use == 0);
  // The pool belongs to the reactor thread: this thread cannot take from it.
  auto denied = rig.conn->reactor().events().acquire();
  REQUIRE(denied.status().code() == hip::Errc::wrong_executor);
}

TEST_CASE("connector: the coroutine forms of fence and close, from the engine's own executor", "[reactor][gpu]") {
  if (!device_present()) return;
  // The engine's context outlives the connector: the reactor thread posts the
  // fence's completion to it and must be done with it before it goes.
  asio::io_context engine;
  Rig rig;
  bool fenced = false;
  std::thread::id resumed_on;
  std::exception_ptr failed;
  asio::co_spawn(engine, engine_step(rig, fenced, resumed_on), [&](std::exception_ptr e) { failed = e; });
  engine.run();
  REQUIRE(!failed);
  REQUIRE(fenced);
  REQUIRE(resumed_on == std::this_thread::get_id());  // on the engine's executor, not the reactor thread
  auto f = rig.conn->finished();
  REQUIRE(f.saves.size() == 2);  // both, the second one settled before async_close resumed
  REQUIRE(f.saves[1].ok);
  REQUIRE_THROWS_AS(rig.conn->save(rig.save_spec("c", 3, 0, 1, Rig::block_range(0, 4))), TransferRefused);
  rig.conn->close();  // stops the thread; waits for nothing now
}

TEST_CASE("connector: a refused batch leaves no claim behind: its blocks are free for the next transfer",
          "[reactor][sim]") {
  Rig rig;
  // Two saves claim blocks 48..55; the third op, a load into 52..55, conflicts.
  std::vector<reactor::Connector::Op> batch;
  batch.push_back({reactor::TransferKind::save, rig.save_spec("d", 4, 0, 1, Rig::block_range(48, 4)), nullptr});
  batch.push_back({reactor::TransferKind::save, rig.save_spec("e", 5, 0, 1, Rig::block_range(52, 4)), nullptr});
  batch.push_back({reactor::TransferKind::load, rig.load_spec("f", 1, 0, 1, Rig::block_range(52, 4), 2), nullptr});
  REQUIRE(refused([&] { rig.conn->submit(std::move(batch)); }));
  REQUIRE(rig.conn->transfers().empty());
  // Nothing of it was posted, and nothing of it is still counted: loads may write every block it named.
  rig.conn->load(rig.load_spec("g", 1, 0, 1, Rig::block_range(48, 4), 2));
  rig.conn->load(rig.load_spec("h", 2, 0, 1, Rig::block_range(52, 4), 3));
}

TEST_CASE("connector: a lookup that hits leaves the reactor polling for the load that follows", "[reactor][gpu]") {
  if (!device_present()) return;
  // A hit's load is the engine's next call. If the reactor has gone to
  // sleep meanwhile, the load pays a cross-CPU wake-up: the answer must set
  // the poller spinning again for reactor_idle_spin.
  reactor::ConnectorOptions o;
  o.reactor_idle_spin = 1s;
  Rig rig(o);
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  REQUIRE(rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); }).saves[0].ok);
  // Asleep: no spin ticks across 100 ms (the save's window ends within 1 s).
  auto asleep = [&] {
    const auto before = rig.conn->poller_stats().spin_ticks;
    std::this_thread::sleep_for(100ms);
    return rig.conn->poller_stats().spin_ticks == before;
  };
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (!asleep()) REQUIRE(std::chrono::steady_clock::now() < give_up);
  rig.conn->lookup(rig.keys(1, 0, 1));
  REQUIRE(rig.wait_for([](const reactor::Finished& f) { return !f.lookups.empty(); }).lookups[0].hit.tokens > 0);
  REQUIRE_FALSE(asleep());
}
