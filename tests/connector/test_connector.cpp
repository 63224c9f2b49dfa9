// The Connector over the embedded tier: round trips on random data, its
// refusals, batches, lookups and coroutine forms. Its failure-catalogue
// entries are test_connector_faults.cpp's.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_future.hpp>
#include <atomic>
#include <future>

#include "connector_rig.hpp"
#include "device/pinned_buffer.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using connector::TransferState;
using kvstrand::FailStop;
using kvstrand::TransferErrc;
using kvstrand::TransferRefused;
namespace asio = boost::asio;

namespace {

// One engine step as a coroutine on the engine's executor.
asio::awaitable<void> engine_step(Rig& rig, bool& fenced, std::thread::id& resumed_on) {
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  // Built outside the co_await (GCC 12, docs/development.md).
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

TEST_CASE("connector: a registration the tier refuses takes no id: the next one's round trip lands byte for byte",
          "[reactor][gpu]") {
  if (!device_present()) return;
  Rig rig;
  // Objects of 256 KiB: larger than the arena's slabs (a sixteenth of the
  // rig's 1.6 MB tier, sized by the first registration).
  kv::Layout big = rig.layout;
  big.layout_name = "rig-big";
  big.planes = {{"k", 64 << 10}};
  big.checkpoint = {};
  device::DeviceBuffer plane = must(device::DeviceBuffer::allocate(4 * (64 << 10)));
  kvstrand::Registration reg;
  reg.layout = big;
  reg.planes = {{plane.data(), 4}};
  try {
    rig.conn->register_layout(reg);
    FAIL("a registration whose objects do not fit a slab was taken");
  } catch (const TransferRefused& e) {
    REQUIRE(e.code() == TransferErrc::tier_full);
  }
  rig.two_group_round_trip();  // registration 1 is the next one, in every table
}

TEST_CASE("connector: save then evict then load into other blocks restores KV and state byte for byte", "[reactor][gpu]") {
  if (!device_present()) return;
  Rig rig;
  rig.round_trip();
}

TEST_CASE("connector: invalidate drops the namespace from the embedded tier: no lookup hits it, a save stores it anew",
          "[reactor]") {
  if (!device_present()) return;
  Rig rig;
  rig.invalidate_round();
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
  require_ok(device::sim::hold_stream(rig.save_stream()));
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
  } catch (const kvstrand::TransferRefused& e) {
    REQUIRE(e.code() == TransferErrc::blocks_in_use);
    REQUIRE(std::string(e.what()).find("registration 0") != std::string::npos);
  }
  same.registration = 2;
  try {
    rig.conn->load(same);
    FAIL("a spec naming no registration was posted");
  } catch (const kvstrand::TransferRefused& e) {
    REQUIRE(e.code() == TransferErrc::bad_spec);
    REQUIRE(std::string(e.what()).find("registration 2 does not exist") != std::string::npos);
  }
  REQUIRE_THROWS_AS(rig.conn->lookup(rig.keys(1, 0, 1), 2), kvstrand::TransferRefused);
  require_ok(device::sim::release_stream(rig.save_stream()));
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 1 && f.loads.size() == 1; });
  REQUIRE(f.saves[0].registration == 0);
  REQUIRE(f.loads[0].registration == rig.swa->id);
}

namespace {

// order_after_load(request) on the engine's stream, asked until the load's
// copies are queued (or 2 s have passed).
kvstrand::LoadOrder order_once_queued(Rig& rig, const std::string& request) {
  kvstrand::LoadOrder order = kvstrand::LoadOrder::not_queued_yet;
  for (int i = 0; i < 10000 && order == kvstrand::LoadOrder::not_queued_yet; ++i) {
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
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 1; });
  REQUIRE(f.saves[0].ok);
  const auto saved = rig.snapshot(Rig::block_range(0, 8), {1});
  rig.randomize(5);
  REQUIRE(rig.conn->order_after_load("a", rig.engine_stream) == kvstrand::LoadOrder::no_live_load);
  // The tier's load stream is held: the load's copies are queued, not run.
  require_ok(device::sim::hold_stream(rig.load_stream()));
  rig.conn->load(rig.load_spec("a", 1, 0, 2, Rig::block_range(20, 8), 9));
  REQUIRE(order_once_queued(rig, "a") == kvstrand::LoadOrder::ordered);
  // Work the engine queues now runs after the copies: a read of the
  // destination (pinned memory, so the read itself is asynchronous).
  const std::uint64_t n = 8 * Rig::kPlaneBlockBytes;
  auto host = must(device::PinnedBuffer::allocate(n));
  require_ok(device::copy_d2h(rig.engine_stream, host.data(), rig.planes[0].data() + 20 * Rig::kPlaneBlockBytes, n));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(rig.engine_stream.query().code() == device::Errc::not_ready);  // waiting for the held copies
  require_ok(device::sim::release_stream(rig.load_stream()));
  require_ok(rig.engine_stream.synchronize());
  REQUIRE(std::vector<std::byte>(host.data(), host.data() + n) ==
          std::vector<std::byte>(saved.begin(), saved.begin() + static_cast<std::ptrdiff_t>(n)));
  f = rig.wait_for([](const kvstrand::Finished& f) { return f.loads.size() == 1; });
  REQUIRE(f.loads[0].ok);
  REQUIRE(rig.conn->order_after_load("a", rig.engine_stream) == kvstrand::LoadOrder::no_live_load);
}

TEST_CASE("connector: a load's copies-queued event is recorded for no other load before its end is drained",
          "[reactor][sim]") {
  if (!device_present() || !sim_hooks_present()) return;
  Rig rig;
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  rig.conn->save(rig.save_spec("b", 2, 0, 2, Rig::block_range(8, 8)));
  rig.wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 2; });
  // a's load ends; its end waits, not drained.
  rig.conn->load(rig.load_spec("a", 1, 0, 2, Rig::block_range(20, 8), 9));
  for (int i = 0; i < 10000 && !rig.conn->finished_pending(); ++i)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  REQUIRE(rig.conn->finished_pending());
  // b's copies are queued and held; its event is recorded.
  require_ok(device::sim::hold_stream(rig.load_stream()));
  rig.conn->load(rig.load_spec("b", 2, 0, 2, Rig::block_range(30, 8), 10));
  REQUIRE(order_once_queued(rig, "b") == kvstrand::LoadOrder::ordered);
  // Ordering after a's load waits for a's copies, which have run: had b's
  // load been lent a's event, the engine's stream would wait for b's held
  // copies.
  auto probe = must(device::Stream::create());
  REQUIRE(rig.conn->order_after_load("a", probe) == kvstrand::LoadOrder::ordered);
  // The probe completes once the sim's stream thread ran (a loaded host, a
  // sanitizer: not within a fixed 50 ms); b's copies stay held throughout,
  // so a probe lent b's event would never complete.
  for (int i = 0; i < 5000 && !probe.query().ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(probe.query().ok());
  require_ok(device::sim::release_stream(rig.load_stream()));
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return f.loads.size() == 2; });
  REQUIRE(f.loads[0].ok);
  REQUIRE(f.loads[1].ok);
}

TEST_CASE("connector: a load starting mid-chunk (the HBM frontier) takes the right blocks", "[reactor][gpu]") {
  if (!device_present()) return;
  Rig rig;
  const auto src = Rig::block_range(0, 8);  // chunks 0 and 1
  const auto tail_before = rig.snapshot({4, 5, 6, 7}, {1});
  rig.conn->save(rig.save_spec("a", 3, 0, 2, src));
  rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  rig.randomize(4);
  // HBM holds tokens [0, 96): load [96, 128) = the last two blocks of chunk 1.
  kv::TransferSpec s = rig.load_spec("a", 3, 1, 2, {30, 31}, 3);
  s.tokens = {96, 128};
  rig.conn->load(s);
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
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
  rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  rig.randomize(6);
  rig.conn->save(rig.save_spec("b", 5, 0, 1, src));  // same key, other bytes
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  REQUIRE(f.saves[0].ok);
  REQUIRE(f.saves[0].request == "b");
  REQUIRE(f.saves[0].blocks == src);  // a save's outcome names its source blocks
  rig.conn->load(rig.load_spec("c", 5, 0, 1, Rig::block_range(10, 4), 0));
  f = rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
  REQUIRE(f.loads[0].ok);
  REQUIRE(rig.snapshot(Rig::block_range(10, 4), {0}) == first);
}

TEST_CASE("connector: a load of chunks the tier lacks fails with exactly its blocks", "[reactor][gpu]") {
  if (!device_present()) return;
  Rig rig;
  const auto dst = std::vector<kv::BlockId>{3, 1, 4, 15};
  rig.conn->load(rig.load_spec("x", 99, 0, 1, dst, 0));
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
  REQUIRE_FALSE(f.loads[0].ok);
  REQUIRE(f.loads[0].error == TransferErrc::missing_chunk);
  REQUIRE(f.failed_loads().size() == 1);
  REQUIRE(f.failed_loads()[0]->blocks == dst);
  REQUIRE(rig.conn->finished().empty());  // a failure is reported once, as a completion
}

TEST_CASE("connector: refusals are typed and post nothing", "[reactor]") {
  if (!device_present()) return;
  SECTION("options") {
    REQUIRE_THROWS_WITH(connector::Connector(with_deadline(0ms)), Catch::Contains("transfer_deadline"));
  }
  SECTION("before registration, duplicates, bad specs, after close") {
    connector::Connector bare;
    Rig rig;
    try {
      bare.save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
      FAIL("accepted a save before registration");
    } catch (const TransferRefused& e) {
      REQUIRE(e.code() == TransferErrc::not_registered);
    }
    REQUIRE(rig.streams.save != nullptr);
    if (device::sim::available()) {
      require_ok(device::sim::hold_stream(rig.save_stream()));
      require_ok(device::sim::hold_stream(rig.load_stream()));
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
    if (device::sim::available()) {
      require_ok(device::sim::release_stream(rig.save_stream()));
      require_ok(device::sim::release_stream(rig.load_stream()));
    }
    rig.wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 1 && f.loads.size() == 1; });
    rig.conn->save(rig.save_spec("a", 1, 1, 2, Rig::block_range(4, 4)));  // drained: no longer live
    rig.conn->close();
    REQUIRE_THROWS_AS(rig.conn->save(rig.save_spec("c", 1, 0, 1, Rig::block_range(0, 4))), TransferRefused);
  }
}

TEST_CASE("connector: the producer event may be recorded again on its stream, and dropped, right after submit",
          "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  Rig rig;
  const auto src = Rig::block_range(0, 8);
  auto producer = std::make_shared<device::Event>(must(device::Event::create()));
  require_ok(device::sim::hold_stream(rig.engine_stream));  // the engine's forward has not run yet
  require_ok(producer->record(rig.engine_stream));
  rig.conn->save(rig.save_spec("r", 1, 0, 2, src), producer);
  wait_for_state(*rig.conn, TransferState::waiting_producer);
  require_ok(producer->record(rig.engine_stream));  // the next step records it again: allowed
  producer.reset();  // and the engine lets go of it: the Connector still holds it (ASan: no use after free)
  std::this_thread::sleep_for(20ms);
  REQUIRE(rig.conn->transfers().size() == 1);  // still waiting for the engine's stream
  require_ok(device::sim::release_stream(rig.engine_stream));
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  REQUIRE(f.saves[0].ok);
}

TEST_CASE("connector: the producer event is let go once seen complete, not kept by the submission ring",
          "[reactor][gpu]") {
  if (!device_present()) return;
  Rig rig;
  auto producer = std::make_shared<device::Event>(must(device::Event::create()));
  require_ok(producer->record(rig.engine_stream));
  rig.conn->save(rig.save_spec("r", 1, 0, 1, Rig::block_range(0, 4)), producer);
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  REQUIRE(f.saves[0].ok);
  // The strand dropped it when it saw it complete; the ring's slot, reused
  // only after 255 more submits, holds no reference either: an engine that
  // pools its events sees this one free again.
  REQUIRE(producer.use_count() == 1);
}

TEST_CASE("connector: a batch submitted to a sleeping reactor is taken with nothing else to wake it",
          "[reactor][gpu]") {
  if (!device_present()) return;
  // submit() puts a batch into the ring and checks once, at its end, whether
  // the reactor sleeps: nothing but that check wakes it here (finished()
  // only reads).
  connector::ConnectorOptions o;
  o.reactor_idle_spin = 0us;
  Rig rig(o);
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(5ms);  // the reactor is asleep again
    std::vector<connector::Connector::Op> ops;
    for (int i = 0; i < 3; ++i)
      ops.push_back({kvstrand::TransferKind::save,
                     rig.save_spec("b" + std::to_string(round * 3 + i), 200 + round * 3 + i, 0, 1,
                                   Rig::block_range(static_cast<std::uint32_t>(4 * i), 4)),
                     nullptr});
    rig.conn->submit(std::move(ops));
    auto f = rig.wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 3; });
    for (const auto& s : f.saves) REQUIRE(s.ok);
  }
}

TEST_CASE("connector: more ends than the ring holds wait behind it, none lost, each once, and a bounded number of "
          "ended transfers is kept for reuse",
          "[reactor][gpu]") {
  if (!device_present()) return;
  // Every save ends before the engine drains any: the mailbox's ring fills
  // and the rest wait behind its lock.
  Rig rig;
  const int n = static_cast<int>(connector::Mailbox::kEndSlots) + 44;
  std::vector<connector::Connector::Op> ops;
  std::vector<std::string> requests;
  for (int i = 0; i < n; ++i) {
    requests.push_back("o" + std::to_string(i));
    ops.push_back({kvstrand::TransferKind::save, rig.save_spec(requests.back(), 1000 + i, 0, 1, Rig::block_range(0, 4)),
                   nullptr});
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
  f = rig.wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 1; });
  REQUIRE(f.saves[0].request == "after");
  // Every ended Transfer is kept for a later start (its coroutine's end
  // comes a strand turn after the transfer's): as many as the table keeps,
  // never more, whatever number ended at once.
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (rig.conn->kept_transfers() < connector::TransferTable::kSpareTransfers &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  REQUIRE(rig.conn->kept_transfers() == connector::TransferTable::kSpareTransfers);
  rig.conn->close();
  REQUIRE(rig.conn->kept_transfers() == 0);  // answered here: no strand to ask once closed
}

TEST_CASE("connector: a device the reactor cannot select is refused at construction, naming it", "[reactor]") {
  if (!device_present()) return;
  connector::ConnectorOptions o;
  o.device = 4096;
  try {
    connector::Connector c(o);
    FAIL("a connector was made for a device that does not exist");
  } catch (const std::invalid_argument& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find("device") != std::string::npos);
    REQUIRE(std::string(e.what()).find("4096") != std::string::npos);
  }
}

TEST_CASE("connector: max_live_transfers and max_live_lookups refuse what would pass them, posting nothing",
          "[reactor][sim]") {
  if (!sim_hooks_present()) return;
  connector::ConnectorOptions opts;
  opts.max_live_transfers = 3;
  opts.max_live_lookups = 1;
  Rig rig(opts);
  require_ok(device::sim::hold_stream(rig.save_stream()));
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  rig.conn->save(rig.save_spec("b", 2, 0, 1, Rig::block_range(4, 4)));
  std::vector<connector::Connector::Op> two;
  two.push_back({kvstrand::TransferKind::save, rig.save_spec("c", 3, 0, 1, Rig::block_range(8, 4)), nullptr});
  two.push_back({kvstrand::TransferKind::save, rig.save_spec("d", 4, 0, 1, Rig::block_range(12, 4)), nullptr});
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
  require_ok(device::sim::release_stream(rig.save_stream()));
  // Drained, there is room again.
  rig.wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 3 && f.lookups.size() == 1; });
  rig.conn->save(rig.save_spec("d", 4, 0, 1, Rig::block_range(12, 4)));
  rig.conn->lookup(rig.keys(9, 0, 1));
}

TEST_CASE("connector: a save and a load of the same blocks at once are refused (blocks_in_use), never interleaved",
          "[reactor][sim]") {
  if (!sim_hooks_present()) return;
  Rig rig;
  rig.conn->save(rig.save_spec("stored", 1, 0, 1, Rig::block_range(0, 4)));
  rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  require_ok(device::sim::hold_stream(rig.save_stream()));
  require_ok(device::sim::hold_stream(rig.load_stream()));
  rig.conn->load(rig.load_spec("in", 1, 0, 1, Rig::block_range(8, 4), 9));  // writes 8..11 and image slot 9
  rig.conn->save(rig.save_spec("out", 2, 0, 1, Rig::block_range(16, 4)));   // reads 16..19 and image slot 0
  REQUIRE(refused([&] { rig.conn->save(rig.save_spec("a", 3, 0, 1, {20, 21, 22, 11})); }));  // 11 is being loaded
  REQUIRE(refused([&] { rig.conn->load(rig.load_spec("b", 1, 0, 1, {30, 31, 32, 19}, 1)); }));  // 19 is being saved
  REQUIRE(refused([&] { rig.conn->load(rig.load_spec("c", 1, 0, 1, {8, 40, 41, 42}, 1)); }));  // 8: two loads
  REQUIRE(refused([&] { rig.conn->load(rig.load_spec("g", 1, 0, 1, Rig::block_range(52, 4), 0)); }));  // slot 0 is read
  auto h = rig.save_spec("h", 6, 0, 1, Rig::block_range(56, 4));
  h.state_slots = {9};  // slot 9 is being loaded into
  REQUIRE(refused([&] { rig.conn->save(h); }));
  std::vector<connector::Connector::Op> batch;  // within one batch too, and nothing of it is posted
  batch.push_back({kvstrand::TransferKind::save, rig.save_spec("d", 4, 0, 1, Rig::block_range(48, 4)), nullptr});
  batch.push_back({kvstrand::TransferKind::load, rig.load_spec("e", 1, 0, 1, Rig::block_range(48, 4), 2), nullptr});
  REQUIRE(refused([&] { rig.conn->submit(std::move(batch)); }));
  rig.conn->save(rig.save_spec("f", 5, 0, 1, Rig::block_range(16, 4)));  // two saves may read the same blocks
  REQUIRE(rig.conn->transfers().size() == 3);
  require_ok(device::sim::release_stream(rig.save_stream()));
  require_ok(device::sim::release_stream(rig.load_stream()));
  rig.wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 2 && f.loads.size() == 1; });
  rig.conn->save(rig.save_spec("a", 3, 0, 1, {20, 21, 22, 11}));  // drained: the blocks are free again
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
  std::vector<connector::Connector::Op> batch;
  batch.push_back({kvstrand::TransferKind::save, rig.save_spec("d", 4, 0, 1, Rig::block_range(48, 4)), nullptr});
  batch.push_back({kvstrand::TransferKind::save, rig.save_spec("e", 5, 0, 1, Rig::block_range(52, 4)), nullptr});
  batch.push_back({kvstrand::TransferKind::load, rig.load_spec("f", 1, 0, 1, Rig::block_range(52, 4), 2), nullptr});
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
  connector::ConnectorOptions o;
  o.reactor_idle_spin = 1s;
  Rig rig(o);
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);
  // Asleep: no spin ticks across 100 ms (the save's window ends within 1 s).
  auto asleep = [&] {
    const auto before = rig.conn->poller_stats().spin_ticks;
    std::this_thread::sleep_for(100ms);
    return rig.conn->poller_stats().spin_ticks == before;
  };
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (!asleep()) REQUIRE(std::chrono::steady_clock::now() < give_up);
  rig.conn->lookup(rig.keys(1, 0, 1));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); }).lookups[0].hit.tokens > 0);
  REQUIRE_FALSE(asleep());
}
