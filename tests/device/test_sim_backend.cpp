// The sim backend's own promises: its injection hooks, and that it checks
// device pointers as a GPU runtime would. Skipped (with a message) on GPU builds.
#include <chrono>
#include <thread>

#include "support.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using device::Errc;
using device::sim::FailAt;

namespace {
// Polls an event for `d`; true if it stayed pending the whole time.
bool stays_pending(const device::Event& ev, std::chrono::milliseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
    if (ev.query().code() != Errc::not_ready) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}
}  // namespace

TEST_CASE("sim: a copy outside any device allocation is refused with the call named", "[sim][fault]") {
  if (!sim_hooks_present()) return;
  auto s = must(device::Stream::create());
  auto dev = must(device::DeviceBuffer::allocate(4096));
  auto host = must(device::PinnedBuffer::allocate(8192));
  device::Status st = device::copy_d2h(s, host.data(), dev.data() + 4000, 200);  // runs past the end
  REQUIRE(st.code() == Errc::invalid_value);
  REQUIRE(st.call() == "hipMemcpyAsync(D2H)");
  REQUIRE(st.describe().find("source is not inside a device allocation") != std::string::npos);
  // Host memory passed as device memory.
  REQUIRE(device::copy_h2d(s, host.data(), host.data() + 4096, 64).code() == Errc::invalid_value);
  // And nothing was queued: the stream is idle.
  require_ok(s.query());
}

TEST_CASE("sim: a held stream keeps its events pending until released", "[sim][fault]") {
  if (!sim_hooks_present()) return;
  auto s = must(device::Stream::create());
  auto ev = must(device::Event::create());
  require_ok(device::sim::hold_stream(s));
  require_ok(ev.record(s));
  REQUIRE(stays_pending(ev, 30ms));
  REQUIRE(s.query().code() == Errc::not_ready);
  require_ok(device::sim::release_stream(s));
  require_ok(ev.synchronize());
  require_ok(s.query());
}

TEST_CASE("sim: a delayed stream completes late but completes", "[sim][fault]") {
  if (!sim_hooks_present()) return;
  auto s = must(device::Stream::create());
  auto ev = must(device::Event::create());
  require_ok(device::sim::set_stream_delay(s, 40ms));
  require_ok(ev.record(s));
  REQUIRE(stays_pending(ev, 15ms));
  require_ok(ev.synchronize());
  require_ok(device::sim::set_stream_delay(s, 0ms));
}

TEST_CASE("sim: a copy failing at submit returns the injected error and queues nothing", "[sim][fault]") {
  if (!sim_hooks_present()) return;
  auto s = must(device::Stream::create());
  auto dev = must(device::DeviceBuffer::allocate(4096));
  const auto before = random_bytes(4096, 7);
  write_device(s, dev.data(), before);
  require_ok(device::sim::fail_copies(s, FailAt::submit, Errc::out_of_memory));
  const auto other = random_bytes(4096, 8);
  device::Status st = device::copy_h2d(s, dev.data(), other.data(), other.size());
  REQUIRE(st.code() == Errc::out_of_memory);
  REQUIRE(st.call() == "hipMemcpyAsync(H2D)");
  REQUIRE(read_device(s, dev.data(), 4096) == before);  // one failure only, and nothing written
}

TEST_CASE("sim: a copy failing on the stream surfaces through the next event, once", "[sim][fault]") {
  if (!sim_hooks_present()) return;
  auto s = must(device::Stream::create());
  auto dev = must(device::DeviceBuffer::allocate(4096));
  auto host = must(device::PinnedBuffer::allocate(4096));
  auto ev = must(device::Event::create());
  require_ok(device::sim::fail_copies(s, FailAt::execute));
  require_ok(device::copy_d2h(s, host.data(), dev.data(), 4096));  // accepted...
  require_ok(ev.record(s));
  device::Status st = ev.synchronize();  // ...and fails on the stream
  REQUIRE(st.code() == Errc::injected_fault);
  REQUIRE(ev.query().code() == Errc::injected_fault);  // the failure sticks to that record
  // The next record after good work is clean again.
  require_ok(device::copy_d2h(s, host.data(), dev.data(), 4096));
  require_ok(ev.record(s));
  require_ok(ev.synchronize());
}

TEST_CASE("sim: destroying a stream finishes its queued work", "[sim]") {
  if (!sim_hooks_present()) return;
  auto dev = must(device::DeviceBuffer::allocate(1 << 16));
  auto host = must(device::PinnedBuffer::allocate(1 << 16));
  const auto data = random_bytes(1 << 16, 9);
  std::memcpy(host.data(), data.data(), data.size());
  auto ev = must(device::Event::create());
  {
    auto s = must(device::Stream::create());
    require_ok(device::sim::set_stream_delay(s, 5ms));
    require_ok(device::copy_h2d(s, dev.data(), host.data(), data.size()));
    require_ok(ev.record(s));
  }  // destroyed with the copy still queued behind the delay
  require_ok(ev.query());
  auto s2 = must(device::Stream::create());
  REQUIRE(read_device(s2, dev.data(), data.size()) == data);
}

TEST_CASE("sim: hooks refuse nonsense", "[sim]") {
  if (!sim_hooks_present()) return;
  auto s = must(device::Stream::create());
  REQUIRE(device::sim::fail_copies(s, FailAt::submit, Errc::success).code() == Errc::invalid_value);
  REQUIRE(device::sim::fail_copies(s, FailAt::submit, Errc::injected_fault, -1).code() == Errc::invalid_value);
}
