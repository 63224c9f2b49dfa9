// How soon the Poller resumes a waiter after its event completes.
//
// A reactor thread runs one strand with one Poller. Each iteration queues a
// host function that busy-waits `work` (standing in for GPU work) and notes
// the time it finished, then records an event; the strand awaits the event
// and notes when it resumed. Wake latency = resumed - finished. Between
// iterations the strand sits idle for a random 0.5-3 ms, so every wait starts
// on an idle poller. The last line is the headline over all iterations:
//   poller wake latency us: p50 X p99 Y
//
// usage: bench_poller [iterations-per-scenario]   (default 1000)
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_future.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "device/device.hpp"
#include "device/event.hpp"
#include "device/stream.hpp"
#include "reactor/poller.hpp"
#include "percentile.hpp"

using namespace kvstrand;
using kvstrand::bench::pct;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

struct Work {
  std::chrono::microseconds busy{};
  std::atomic<std::int64_t> finished_ns{0};
};

void busy_then_mark(void* p) {
  auto* w = static_cast<Work*>(p);
  const auto end = Clock::now() + w->busy;
  while (Clock::now() < end) {
  }
  w->finished_ns.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
}

void die(const device::Status& s) {
  std::fprintf(stderr, "bench_poller: %s\n", s.describe().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::max(10, std::atoi(argv[1])) : 1000;
  if (auto n = device::device_count(); !n.ok() || *n == 0) {
    std::fprintf(stderr, "bench_poller: no %s device\n", device::backend_name());
    return 1;
  }
  if (auto s = device::select_device(0); !s.ok()) die(s);
  auto stream = device::Stream::create();
  auto event = device::Event::create();
  if (!stream.ok()) die(stream.status());
  if (!event.ok()) die(event.status());

  asio::io_context ctx;
  auto guard = asio::make_work_guard(ctx);
  common::Strand strand = asio::make_strand(ctx);
  reactor::Poller poller(strand);
  std::thread reactor_thread([&] { ctx.run(); });

  const std::vector<int> scenarios_us = {0, 50, 500, 5000};
  std::vector<double> all;
  std::printf("bench_poller: backend %s, %d iterations per scenario, idle strand between waits\n",
              device::backend_name(), iterations);
  for (int work_us : scenarios_us) {
    const int n = work_us >= 5000 ? std::max(10, iterations / 10) : iterations;
    std::vector<double> lat;
    auto run = [&]() -> asio::awaitable<void> {
      std::mt19937 rng(work_us);
      std::uniform_int_distribution<int> idle_us(500, 3000);
      asio::steady_timer idle(strand);
      Work w;
      w.busy = std::chrono::microseconds(work_us);
      for (int i = 0; i < n; ++i) {
        idle.expires_after(std::chrono::microseconds(idle_us(rng)));
        co_await idle.async_wait(asio::use_awaitable);
        w.finished_ns = 0;
        if (auto s = stream->host_func(&busy_then_mark, &w); !s.ok()) die(s);
        if (auto s = event->record(*stream); !s.ok()) die(s);
        std::error_code ec = co_await poller.ready(*event);
        const auto resumed = Clock::now().time_since_epoch().count();
        if (ec) die(device::Status(device::Errc::backend_error, "poller.ready", ec.message()));
        lat.push_back(static_cast<double>(resumed - w.finished_ns.load(std::memory_order_acquire)) / 1000.0);
      }
    };
    auto task = run();
    asio::co_spawn(strand, std::move(task), asio::use_future).get();
    std::printf("  work %5d us: %4d waits, wake latency us: p50 %7.1f p99 %7.1f max %7.1f\n", work_us, n,
                pct(lat, 0.5), pct(lat, 0.99), pct(lat, 1.0));
    std::fflush(stdout);
    all.insert(all.end(), lat.begin(), lat.end());
  }
  auto stats_task = [&]() -> asio::awaitable<reactor::PollerStats> { co_return poller.stats(); };
  auto st = asio::co_spawn(strand, stats_task(), asio::use_future).get();
  std::printf("  poller ticks %llu (spin %llu, timer %llu)\n", static_cast<unsigned long long>(st.ticks),
              static_cast<unsigned long long>(st.spin_ticks), static_cast<unsigned long long>(st.timer_ticks));
  guard.reset();
  reactor_thread.join();
  std::printf("poller wake latency us: p50 %.1f p99 %.1f\n", pct(all, 0.5), pct(all, 0.99));
  return 0;
}
