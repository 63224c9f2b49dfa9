// common::Notifier: the named wake-up that replaced cancelling a timer.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <exception>
#include <optional>
#include <vector>

#include "common/notifier.hpp"

using namespace kvstrand;
using namespace std::chrono_literals;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

struct Fixture {
  asio::io_context ctx;
  common::Strand strand = asio::make_strand(ctx);
  common::Notifier n{strand};

  // Starts `a` on the strand; its result lands in `out`.
  template <class T>
  void start(asio::awaitable<T> a, std::optional<T>& out) {
    asio::co_spawn(strand, std::move(a), [&out](std::exception_ptr e, T v) {
      REQUIRE_FALSE(e);
      out = v;
    });
  }
  // Runs handlers until `done`, nothing is left to run, or 10 s have
  // passed (a waiter that is not woken then is not woken by notify()).
  template <class Done>
  void run_until(Done done) {
    ctx.restart();  // a context that ran out of work stops until restarted
    const auto end = Clock::now() + 10s;
    while (!done() && Clock::now() < end) {
      ctx.run_one_for(50ms);
      if (ctx.stopped()) ctx.restart();
    }
  }
};

}  // namespace

TEST_CASE("notifier: notify wakes every coroutine waiting then, and only those", "[common]") {
  Fixture f;
  std::optional<bool> a, b;
  // Their deadlines an hour away: only notify() ends them within
  // run_until's 10 s.
  f.start(f.n.wait(), a);
  f.start(f.n.wait_for(1h), b);
  f.run_until([&] { return f.n.waiting() == 2; });
  REQUIRE(f.n.waiting() == 2);
  f.n.notify();
  f.run_until([&] { return a && b; });
  REQUIRE(a == true);
  REQUIRE(b == true);
  REQUIRE(f.n.waiting() == 0);
  // Nobody waiting: nothing is kept for a later waiter, which waits to its
  // deadline.
  f.n.notify();
  std::optional<bool> c;
  const auto started = Clock::now();
  f.start(f.n.wait_for(30ms), c);
  f.run_until([&] { return c.has_value(); });
  REQUIRE(c == false);
  REQUIRE(Clock::now() - started >= 30ms);
}

TEST_CASE("notifier: wait_until looks again at each notify and ends when the condition holds or at the deadline",
          "[common]") {
  Fixture f;
  int left = 3;
  auto none_left = [&] { return left == 0; };
  std::optional<bool> done;
  f.start(f.n.wait_until(none_left, Clock::now() + 1h), done);
  // Each step notifies; only the third makes the condition true.
  for (int i = 0; i < 3; ++i) {
    f.run_until([&] { return f.n.waiting() == 1; });
    REQUIRE_FALSE(done);
    --left;
    f.n.notify();
  }
  f.run_until([&] { return done.has_value(); });
  REQUIRE(done == true);

  // Never true: false at the deadline, not before.
  auto never = [] { return false; };
  std::optional<bool> timed_out;
  const auto started = Clock::now();
  f.start(f.n.wait_until(never, Clock::now() + 30ms), timed_out);
  f.run_until([&] { return timed_out.has_value(); });
  REQUIRE(timed_out == false);
  REQUIRE(Clock::now() - started >= 30ms);
}

TEST_CASE("notifier: a waiter cancelled through its slot ends false and leaves the list", "[common]") {
  Fixture f;
  asio::cancellation_signal cancel;
  std::optional<bool> woken;
  asio::co_spawn(f.strand, f.n.wait(), asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, bool v) {
                   REQUIRE_FALSE(e);
                   woken = v;
                 }));
  f.run_until([&] { return f.n.waiting() == 1; });
  asio::post(f.strand, [&] { cancel.emit(asio::cancellation_type::terminal); });
  f.run_until([&] { return woken.has_value(); });
  REQUIRE(woken == false);
  REQUIRE(f.n.waiting() == 0);
  f.n.notify();  // touches no waiter that is gone (the ASan suite would say)
}
