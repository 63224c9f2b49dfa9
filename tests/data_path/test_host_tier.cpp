// HostTier, the one data path of the host tiers, over an index plane that
// answers late (a server that stalls): what the data path does when the
// reactor has given up on a transfer before its index answered.
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <atomic>

#include "connector_rig.hpp"
#include "data_path/host_tier.hpp"
#include "device/keep_for_process_life.hpp"
#include "index_plane/local_index.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using kvstrand::FailStop;
using kvstrand::TransferErrc;
namespace asio = boost::asio;

namespace {

// LocalIndex, except that while `late` is set a load's hold and a save's
// reserve answer only after `delay` (and a hold never at once).
class LateIndex final : public index_plane::LocalIndex {
 public:
  LateIndex(reactor::Reactor& r, std::uint64_t bytes, std::atomic<bool>& late, std::chrono::milliseconds delay)
      : LocalIndex(bytes), reactor_(r), late_(late), delay_(delay) {}

  asio::awaitable<Places> reserve(std::uint32_t reg, const std::vector<kv::ChunkKey>& keys,
                                  const std::vector<bool>& images, const std::vector<std::string>& events,
                                  Clock::time_point deadline) override {
    co_await stall();
    co_return co_await LocalIndex::reserve(reg, keys, images, events, deadline);
  }
  asio::awaitable<Held> hold(const kv::TransferSpec& spec, Clock::time_point deadline) override {
    co_await stall();
    co_return co_await LocalIndex::hold(spec, deadline);
  }
  // Late, it has no answer at once: the load awaits hold().
  std::optional<Held> hold_now(const kv::TransferSpec& spec) override {
    if (late_) return std::nullopt;
    return LocalIndex::hold_now(spec);
  }
  const char* kind() const noexcept override { return "late"; }

 private:
  asio::awaitable<void> stall() {
    if (!late_) co_return;
    asio::steady_timer t(reactor_.strand(), delay_);
    boost::system::error_code ec;
    co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  reactor::Reactor& reactor_;
  std::atomic<bool>& late_;
  std::chrono::milliseconds delay_;
};

// A 150 ms transfer deadline, over a HostTier whose index answers 400 ms
// late while `late` is set.
connector::ConnectorOptions over_late_index(std::atomic<bool>& late) {
  connector::ConnectorOptions o;
  o.transfer_deadline = 150ms;
  o.make_index = [&late](reactor::Reactor& r) { return std::make_unique<LateIndex>(r, 64ull << 20, late, 400ms); };
  return o;
}

}  // namespace

TEST_CASE("host tier: a load whose index answers after its deadline never copies into the engine's blocks",
          "[reactor][fault]") {
  std::atomic<bool> late{false};
  Rig rig(over_late_index(late));
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  REQUIRE(f.saves[0].ok);

  const auto dst = Rig::block_range(8, 4);
  const auto before = rig.snapshot(dst, {3});
  late = true;
  rig.conn->load(rig.load_spec("a", 1, 0, 1, dst, 3));
  REQUIRE(wait_for_fail_stop(*rig.conn).code() == TransferErrc::deadline_exceeded);
  // The engine was told the load failed: its blocks are its own again. The
  // index answers 250 ms later; nothing may be copied into them then.
  std::this_thread::sleep_for(600ms);
  REQUIRE(rig.snapshot(dst, {3}) == before);
  // And the transfer ended for the tier too: nothing is left running.
  REQUIRE(rig.conn->transfers().empty());
  rig.conn->close();
  REQUIRE(rig.conn->never_ended() == 0);
}

TEST_CASE("host tier: a save whose index answers after its deadline publishes nothing", "[reactor][fault]") {
  std::atomic<bool> late{true};
  Rig rig(over_late_index(late));
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  REQUIRE(wait_for_fail_stop(*rig.conn).code() == TransferErrc::deadline_exceeded);
  std::this_thread::sleep_for(600ms);
  REQUIRE(rig.conn->transfers().empty());
  // Its places were given back, not committed: the tier stores nothing.
  const tier::Index::Stats s = rig.conn->tier_stats();
  REQUIRE(s.objects == 0);
  REQUIRE(s.writing == 0);
  rig.conn->close();
  REQUIRE(rig.conn->never_ended() == 0);
}

TEST_CASE("host tier: a save whose device copy failed commits nothing: no half-written object is ever visible",
          "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  Rig rig;
  require_ok(device::sim::fail_copies(rig.save_stream(), device::sim::FailAt::execute));
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  REQUIRE_FALSE(f.saves[0].ok);
  INFO(f.saves[0].reason);
  REQUIRE(f.saves[0].reason.find("injected") != std::string::npos);
  const tier::Index::Stats s = rig.conn->tier_stats();
  REQUIRE(s.objects == 0);
  REQUIRE(s.writing == 0);  // given back, not left reserved
  rig.conn->lookup(rig.keys(1, 0, 2));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); }).lookups[0].hit.tokens == 0);
}

TEST_CASE("host tier: a load whose device copy failed unpins what it pinned", "[reactor][sim][fault]") {
  if (!sim_hooks_present()) return;
  Rig rig;
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);
  require_ok(device::sim::fail_copies(rig.load_stream(), device::sim::FailAt::execute));
  rig.conn->load(rig.load_spec("b", 1, 0, 2, Rig::block_range(16, 8), 3));
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
  REQUIRE_FALSE(f.loads[0].ok);
  REQUIRE(rig.conn->tier_stats().pinned == 0);
  // And the next load of the same chunks pins and copies them again.
  rig.conn->load(rig.load_spec("c", 1, 0, 2, Rig::block_range(16, 8), 3));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); }).loads[0].ok);
  REQUIRE(rig.conn->tier_stats().pinned == 0);
}

TEST_CASE("host tier: a tier whose copies all ended keeps nothing for the process's life when it goes",
          "[reactor][sim]") {
  // Only a copy never seen to end keeps its streams and memory for good;
  // a tier that saw every copy end frees them.
  const std::size_t before = device::kept_for_process_life();
  {
    Rig rig;
    rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
    REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);
    rig.conn->load(rig.load_spec("b", 1, 0, 2, Rig::block_range(16, 8), 3));
    REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); }).loads[0].ok);
  }
  REQUIRE(device::kept_for_process_life() == before);
}

TEST_CASE("host tier: a load with state needs an image stored at its last chunk's end: else it fails and writes "
          "nothing",
          "[reactor][sim]") {
  Rig rig;  // the embedded index: its hold says whether the last chunk carries an image
  const auto src = Rig::block_range(0, 12);  // 3 chunks of 4 blocks
  // Prompt 1: an image at its first chunk's end only; prompt 2: at its last only.
  auto first_only = rig.save_spec("a", 1, 0, 3, src);
  first_only.state_slots = {0, -1, -1};
  auto last_only = rig.save_spec("b", 2, 0, 3, src);
  last_only.state_slots = {-1, -1, 1};
  const auto saved = rig.snapshot(src, {1});
  rig.conn->save(first_only);
  rig.conn->save(last_only);
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return f.saves.size() == 2; });
  REQUIRE((f.saves[0].ok && f.saves[1].ok));

  rig.randomize(3);
  const auto dst = Rig::block_range(20, 12);
  const auto untouched = rig.snapshot(dst, {7});
  rig.conn->load(rig.load_spec("a", 1, 0, 3, dst, 7));
  f = rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
  INFO(f.loads[0].reason);
  REQUIRE_FALSE(f.loads[0].ok);
  REQUIRE(f.loads[0].error == TransferErrc::missing_chunk);
  REQUIRE(f.loads[0].reason.find("no checkpoint image") != std::string::npos);
  REQUIRE(rig.snapshot(dst, {7}) == untouched);  // neither the blocks nor the state slot

  rig.conn->load(rig.load_spec("b", 2, 0, 3, dst, 7));
  f = rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
  INFO(f.loads[0].reason);
  REQUIRE(f.loads[0].ok);
  REQUIRE(rig.snapshot(dst, {7}) == saved);  // slot 7 holds the image taken from slot 1
}
