// The polled awaitable: one Poller per strand resumes every waiter when its
// event completes, in completion order, with error codes rather than throws.
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <thread>

#include "reactor/poller.hpp"
#include "support.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
namespace asio = boost::asio;
using reactor::Poller;
using common::Strand;

namespace {

// Runs `body(poller, strand)` as a coroutine on a strand of a fresh
// io_context, on this thread, failing the test if it has not finished in 20 s.
template <class Body>
void run_on_strand(Body body, reactor::PollerOptions options = {}) {
  asio::io_context ctx;
  Strand strand = asio::make_strand(ctx);
  Poller poller(strand, options);
  bool done = false;
  std::exception_ptr error;
  auto coro = body(poller, strand);
  asio::co_spawn(strand, std::move(coro), [&](std::exception_ptr e) {
    error = e;
    done = true;
    poller.shutdown();
  });
  ctx.run_for(20s);
  REQUIRE(done);
  if (error) std::rethrow_exception(error);
}

asio::awaitable<void> sleep_for(Strand& strand, std::chrono::microseconds d) {
  asio::steady_timer t(strand, d);
  co_await t.async_wait(asio::use_awaitable);
}

asio::awaitable<void> wait_then(Poller& poller, const device::Event& ev, std::function<void(std::error_code)> done) {
  std::error_code ec = co_await poller.ready(ev);
  done(ec);
}

// Starts a wait on the strand that reports its outcome when resumed. (A
// coroutine function, not a lambda: a spawned lambda coroutine would outlive
// its closure.)
void spawn_wait(Strand& strand, Poller& poller, const device::Event& ev, std::function<void(std::error_code)> done) {
  asio::co_spawn(strand, wait_then(poller, ev, std::move(done)), asio::detached);
}

void sleep_30ms(void*) { std::this_thread::sleep_for(30ms); }

}  // namespace

TEST_CASE("poller: waiters resume in completion order, not wait order", "[poller][sim]") {
  if (!sim_hooks_present()) return;
  std::vector<device::Stream> streams;
  std::vector<device::Event> events;
  for (int i = 0; i < 3; ++i) {
    streams.push_back(must(device::Stream::create()));
    events.push_back(must(device::Event::create()));
    require_ok(device::sim::hold_stream(streams[i]));
    require_ok(events[i].record(streams[i]));
  }
  std::vector<int> order;
  run_on_strand([&](Poller& poller, Strand& strand) -> asio::awaitable<void> {
    for (int i = 0; i < 3; ++i)  // waits begin in the order 0, 1, 2
      spawn_wait(strand, poller, events[i], [&order, i](std::error_code ec) {
        REQUIRE(!ec);
        order.push_back(i);
      });
    for (int i = 2; i >= 0; --i) {  // ...and complete in the order 2, 1, 0
      const std::size_t before = order.size();
      require_ok(device::sim::release_stream(streams[i]));
      while (order.size() == before) co_await sleep_for(strand, 100us);
    }
  });
  REQUIRE(order == std::vector<int>{2, 1, 0});
}

TEST_CASE("poller: 1500 outstanding waits on one strand all complete", "[poller][gpu]") {
  if (!device_present()) return;
  constexpr int n = 1500;
  auto s = must(device::Stream::create());
  auto dev = must(device::DeviceBuffer::allocate(1 << 16));
  auto host = must(device::PinnedBuffer::allocate(1 << 16));
  std::vector<device::Event> events;
  for (int i = 0; i < n; ++i) events.push_back(must(device::Event::create()));
  const bool held = device::sim::available() && device::sim::hold_stream(s).ok();
  for (auto& ev : events) {
    require_ok(device::copy_d2h(s, host.data(), dev.data(), 4096));
    require_ok(ev.record(s));
  }
  int completed = 0;
  std::size_t outstanding_while_held = 0;
  run_on_strand([&](Poller& poller, Strand& strand) -> asio::awaitable<void> {
    for (auto& ev : events)
      spawn_wait(strand, poller, ev, [&completed](std::error_code ec) {
        REQUIRE(!ec);
        ++completed;
      });
    co_await sleep_for(strand, 5ms);
    outstanding_while_held = poller.stats().outstanding;
    if (held) require_ok(device::sim::release_stream(s));
    while (completed < n) co_await sleep_for(strand, 200us);
    REQUIRE(poller.stats().outstanding == 0);
    REQUIRE(poller.stats().completed == static_cast<std::uint64_t>(n));
  });
  REQUIRE(completed == n);
  if (held) REQUIRE(outstanding_while_held == static_cast<std::size_t>(n));
}

TEST_CASE("poller: a failure before the event completes the wait with the device error", "[poller][sim][fault]") {
  if (!sim_hooks_present()) return;
  auto s = must(device::Stream::create());
  auto dev = must(device::DeviceBuffer::allocate(4096));
  auto host = must(device::PinnedBuffer::allocate(4096));
  auto ev = must(device::Event::create());
  require_ok(device::sim::fail_copies(s, device::sim::FailAt::execute));
  require_ok(device::copy_d2h(s, host.data(), dev.data(), 4096));
  require_ok(ev.record(s));
  std::error_code got;
  run_on_strand([&](Poller& poller, Strand&) -> asio::awaitable<void> {
    got = co_await poller.ready(ev);  // an error code, not an exception
    REQUIRE(poller.stats().failed == 1);
  });
  REQUIRE(got == device::Errc::injected_fault);
}

TEST_CASE("poller: cancelling one wait ends it alone", "[poller][sim]") {
  if (!sim_hooks_present()) return;
  auto s = must(device::Stream::create());
  auto ev = must(device::Event::create());
  require_ok(device::sim::hold_stream(s));
  require_ok(ev.record(s));
  std::error_code cancelled_ec, other_ec{device::Errc::backend_error};
  bool cancelled_done = false, other_done = false;
  run_on_strand([&](Poller& poller, Strand& strand) -> asio::awaitable<void> {
    asio::cancellation_signal sig;
    auto cancellable = [&]() -> asio::awaitable<void> {
      cancelled_ec = co_await poller.async_ready(ev, asio::bind_cancellation_slot(sig.slot(), asio::use_awaitable));
      cancelled_done = true;
    };
    asio::co_spawn(strand, cancellable(), asio::detached);
    spawn_wait(strand, poller, ev, [&](std::error_code ec) {
      other_ec = ec;
      other_done = true;
    });
    co_await sleep_for(strand, 2ms);
    REQUIRE(poller.stats().outstanding == 2);
    sig.emit(asio::cancellation_type::terminal);
    REQUIRE(cancelled_done);
    REQUIRE(cancelled_ec == std::errc::operation_canceled);
    REQUIRE(poller.stats().outstanding == 1);
    require_ok(device::sim::release_stream(s));
    while (!other_done) co_await sleep_for(strand, 100us);
  });
  REQUIRE(!other_ec);
}

TEST_CASE("poller: shutdown ends every wait with operation_canceled, and later ones too", "[poller][sim]") {
  if (!sim_hooks_present()) return;
  auto s = must(device::Stream::create());
  auto ev = must(device::Event::create());
  require_ok(device::sim::hold_stream(s));
  require_ok(ev.record(s));
  int cancelled = 0;
  run_on_strand([&](Poller& poller, Strand& strand) -> asio::awaitable<void> {
    for (int i = 0; i < 5; ++i)
      spawn_wait(strand, poller, ev, [&](std::error_code ec) { cancelled += ec == std::errc::operation_canceled; });
    co_await sleep_for(strand, 1ms);
    poller.shutdown();
    REQUIRE(cancelled == 5);
    std::error_code late = co_await poller.ready(ev);
    REQUIRE(late == std::errc::operation_canceled);
  });
  require_ok(device::sim::release_stream(s));
}

TEST_CASE("poller: a completion is observed with no new work arriving (F5)", "[poller][gpu]") {
  if (!device_present()) return;
  auto s = must(device::Stream::create());
  auto ev = must(device::Event::create());
  reactor::PollerOptions opts;
  opts.spin = 1ms;  // the 30 ms wait outlasts the spin: the backoff timer must find it
  std::uint64_t timer_ticks = 0;
  run_on_strand(
      [&](Poller& poller, Strand&) -> asio::awaitable<void> {
        require_ok(s.host_func(&sleep_30ms, nullptr));
        require_ok(ev.record(s));
        std::error_code ec = co_await poller.ready(ev);
        REQUIRE(!ec);
        require_ok(ev.query());
        timer_ticks = poller.stats().timer_ticks;
      },
      opts);
  REQUIRE(timer_ticks > 0);
}

TEST_CASE("poller: idle costs nothing, and other strand work runs while it spins", "[poller][sim]") {
  if (!sim_hooks_present()) return;
  auto s = must(device::Stream::create());
  auto ev = must(device::Event::create());
  require_ok(device::sim::hold_stream(s));
  require_ok(ev.record(s));
  // The spin window spans the whole test: with the default 2 ms, a strand
  // slowed past 2 ms before the first tick (TSan, a loaded CI machine) backs
  // off on the timer at once and never spins.
  reactor::PollerOptions options;
  options.spin = 60s;
  run_on_strand([&](Poller& poller, Strand& strand) -> asio::awaitable<void> {
    bool done = false;
    spawn_wait(strand, poller, ev, [&](std::error_code ec) {
      REQUIRE(!ec);
      done = true;
    });
    // While the wait spins on the strand, timers on the same strand still fire.
    int beats = 0;
    for (; beats < 10; ++beats) co_await sleep_for(strand, 500us);
    REQUIRE(poller.stats().spin_ticks > 0);
    require_ok(device::sim::release_stream(s));
    while (!done) co_await sleep_for(strand, 100us);
    const auto ticks = poller.stats().ticks;
    co_await sleep_for(strand, 20ms);
    REQUIRE(poller.stats().ticks == ticks);  // nothing outstanding: no ticks
    REQUIRE(poller.stats().outstanding == 0);
  }, options);
}

TEST_CASE("poller: a wait that arrives while the poller sleeps its backoff is not left to wait it out", "[poller][sim]") {
  if (!sim_hooks_present()) return;
  // One event that will not complete keeps the poller backing off; the
  // backoff here is 5 s, so a new wait left to the timer would take 5 s.
  auto held = must(device::Stream::create());
  auto free_stream = must(device::Stream::create());
  auto stuck = must(device::Event::create());
  auto done_ev = must(device::Event::create());
  require_ok(device::sim::hold_stream(held));
  require_ok(stuck.record(held));
  require_ok(done_ev.record(free_stream));
  require_ok(free_stream.synchronize());
  reactor::PollerOptions o;
  o.spin = 0us;
  o.idle_spin = 0us;
  o.min_backoff = o.max_backoff = 5s;
  std::chrono::steady_clock::duration waited{};
  std::uint64_t timer_ticks_before = 0;
  run_on_strand([&](Poller& poller, Strand& strand) -> asio::awaitable<void> {
    spawn_wait(strand, poller, stuck, [](std::error_code) {});  // ended by the shutdown at the end
    co_await sleep_for(strand, 50ms);
    timer_ticks_before = poller.stats().timer_ticks;
    const auto t0 = std::chrono::steady_clock::now();
    const std::error_code ec = co_await poller.ready(done_ev);
    waited = std::chrono::steady_clock::now() - t0;
    REQUIRE(!ec);
  }, o);
  require_ok(device::sim::release_stream(held));
  REQUIRE(timer_ticks_before >= 1);  // it was asleep on the timer when the wait came
  // A bound against a needless wait, not a timing: the backoff is 5 s.
  REQUIRE(waited < 2500ms);
}
