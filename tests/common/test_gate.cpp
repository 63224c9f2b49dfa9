// common::Gate: the one way a component stops what it started.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <exception>
#include <optional>
#include <stdexcept>

#include "common/gate.hpp"

using namespace kvstrand;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

asio::awaitable<void> sleep_for(std::chrono::milliseconds d, int* ended) {
  asio::steady_timer t(co_await asio::this_coro::executor, d);
  boost::system::error_code ec;
  co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  ++*ended;
}

asio::awaitable<void> throws() {
  throw std::runtime_error("injected");
  co_return;
}

// Runs `close` on the strand to its end; what it returned.
bool run_close(asio::io_context& ctx, common::Strand& strand, common::Gate& gate, std::chrono::milliseconds bound) {
  std::optional<bool> closed;
  asio::co_spawn(strand, gate.close(bound), [&](std::exception_ptr, bool ok) { closed = ok; });
  while (!closed && ctx.run_one() != 0) {
  }
  REQUIRE(closed.has_value());
  return *closed;
}

}  // namespace

TEST_CASE("gate: close completes once everything inside ended, and refuses what comes after", "[common]") {
  asio::io_context ctx;
  common::Strand strand = asio::make_strand(ctx);
  common::Gate gate(strand);
  int ended = 0;
  int done = 0;
  REQUIRE(gate.spawn(sleep_for(20ms, &ended), [&](std::exception_ptr) { ++done; }));
  REQUIRE(gate.spawn(sleep_for(40ms, &ended), [&](std::exception_ptr) { ++done; }));
  REQUIRE(gate.inside() == 2);
  // An hour: close must end when the last one leaves, not at its bound.
  REQUIRE(run_close(ctx, strand, gate, 1h));
  REQUIRE(ended == 2);
  REQUIRE(done == 2);
  REQUIRE(gate.inside() == 0);
  REQUIRE(gate.closing());
  REQUIRE_FALSE(gate.spawn(sleep_for(1ms, &ended), [&](std::exception_ptr) { ++done; }));
  ctx.run();
  REQUIRE(ended == 2);  // refused work never ran
}

TEST_CASE("gate: close with nothing inside completes at once", "[common]") {
  asio::io_context ctx;
  common::Strand strand = asio::make_strand(ctx);
  common::Gate gate(strand);
  REQUIRE(run_close(ctx, strand, gate, 5s));
}

TEST_CASE("gate: close says false at its bound while something still runs", "[common]") {
  asio::io_context ctx;
  common::Strand strand = asio::make_strand(ctx);
  common::Gate gate(strand);
  int ended = 0;
  REQUIRE(gate.spawn(sleep_for(300ms, &ended), [](std::exception_ptr) {}));
  REQUIRE_FALSE(run_close(ctx, strand, gate, 30ms));
  REQUIRE(gate.inside() == 1);
  ctx.run();  // it ends later, and leaves the gate
  REQUIRE(ended == 1);
  REQUIRE(gate.inside() == 0);
}

TEST_CASE("gate: a coroutine ended by an exception leaves the gate, its completion sees the exception", "[common]") {
  asio::io_context ctx;
  common::Strand strand = asio::make_strand(ctx);
  common::Gate gate(strand);
  std::exception_ptr seen;
  REQUIRE(gate.spawn(throws(), [&](std::exception_ptr e) { seen = e; }));
  REQUIRE(run_close(ctx, strand, gate, 5s));
  REQUIRE(seen != nullptr);
}
