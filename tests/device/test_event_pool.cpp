// EventPool: reuse without creation on the hot path, destruction only after
// completion, and ownership by one thread (catalogue F10).
#include <chrono>
#include <future>
#include <thread>

#include "device/event_pool.hpp"
#include "support.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using device::Errc;
using device::EventPool;

TEST_CASE("pool: after warm-up the hot path creates no events", "[device][pool][gpu]") {
  if (!device_present()) return;
  auto s = must(device::Stream::create());
  EventPool pool({.warm = 8});
  require_ok(pool.warm_up());
  REQUIRE(pool.stats().created == 8);
  auto dev = must(device::DeviceBuffer::allocate(1 << 16));
  auto host = must(device::PinnedBuffer::allocate(1 << 16));
  for (int step = 0; step < 500; ++step) {
    std::vector<EventPool::Lease> leases;
    for (int i = 0; i < 4; ++i) {  // four transfers in flight per step
      require_ok(device::copy_d2h(s, host.data(), dev.data(), 4096));
      auto lease = must(pool.acquire());
      require_ok(lease.record(s));
      leases.push_back(std::move(lease));
    }
    require_ok(leases.back().event().synchronize());
  }  // leases go back to the pool each step
  const auto st = pool.stats();
  INFO("created " << st.created << " reused " << st.reused);
  REQUIRE(st.created <= 8);
  REQUIRE(st.acquired == 2000);
  REQUIRE(st.in_use == 0);
  REQUIRE(st.records == 2000);
}

TEST_CASE("pool: an event still pending is never handed out again", "[device][pool][sim][fault]") {
  if (!sim_hooks_present()) return;
  auto s = must(device::Stream::create());
  EventPool pool;
  const void* pending_native = nullptr;
  require_ok(device::sim::hold_stream(s));
  {
    auto lease = must(pool.acquire());
    require_ok(lease.record(s));
    pending_native = lease.event().native();
  }  // released while its record is still queued behind the hold
  REQUIRE(pool.stats().retiring == 1);
  auto other = must(pool.acquire());
  REQUIRE(other.event().native() != pending_native);  // a new one, not the pending one
  REQUIRE(pool.stats().created == 2);
  require_ok(device::sim::release_stream(s));
  require_ok(s.synchronize());
  pool.reclaim();
  REQUIRE(pool.stats().retiring == 0);
  REQUIRE(pool.stats().idle == 1);
  auto again = must(pool.acquire());
  REQUIRE(again.event().native() == pending_native);  // reused once complete
}

TEST_CASE("pool: events past max_records or with a failure are destroyed, once complete", "[device][pool][sim][fault]") {
  if (!sim_hooks_present()) return;
  auto s = must(device::Stream::create());
  EventPool pool({.max_records = 3});
  {
    auto lease = must(pool.acquire());
    for (int i = 0; i < 3; ++i) require_ok(lease.record(s));
    require_ok(lease.event().synchronize());
  }
  pool.reclaim();
  REQUIRE(pool.stats().destroyed == 1);
  REQUIRE(pool.stats().max_records_one == 3);

  auto dev = must(device::DeviceBuffer::allocate(4096));
  auto host = must(device::PinnedBuffer::allocate(4096));
  require_ok(device::sim::fail_copies(s, device::sim::FailAt::execute));
  {
    auto lease = must(pool.acquire());
    require_ok(device::copy_d2h(s, host.data(), dev.data(), 4096));
    require_ok(lease.record(s));
    REQUIRE(lease.event().synchronize().code() == Errc::injected_fault);
  }
  pool.reclaim();
  REQUIRE(pool.stats().destroyed == 2);
  REQUIRE(pool.stats().live == 0);
}

TEST_CASE("pool: acquire from a thread that does not own it is refused", "[device][pool][gpu]") {
  if (!device_present()) return;
  EventPool pool;
  { auto first = must(pool.acquire()); }  // binds the pool to this thread
  device::Status other;
  std::thread t([&] {
    auto r = pool.acquire();
    other = r.status();
  });
  t.join();
  REQUIRE(other.code() == Errc::wrong_executor);
  REQUIRE(pool.stats().created == 1);
}

TEST_CASE("pool: destruction never waits on the device: a pending event is left alive, not destroyed",
          "[device][pool][sim]") {
  if (!sim_hooks_present()) return;
  auto s = must(device::Stream::create());
  auto pool = std::make_unique<EventPool>();
  require_ok(device::sim::hold_stream(s));
  {
    auto lease = must(pool->acquire());
    require_ok(lease.record(s));
  }
  // With the stream held for good (a wedged copy), destruction returns: run
  // it on another thread so that a destructor that waits fails this test
  // instead of hanging it.
  auto destroying = std::async(std::launch::async, [&] { pool.reset(); });
  const bool returned = destroying.wait_for(5s) == std::future_status::ready;
  require_ok(device::sim::release_stream(s));  // the held record runs into the event left alive
  destroying.wait();
  REQUIRE(returned);
  require_ok(s.synchronize());
}
