// The polled awaitable: `co_await poller.ready(event)` on the reactor strand.
//
// One Poller serves every outstanding event of one strand. Each tick queries
// every outstanding event and resumes the waiters whose event completed, in
// the order completions are observed (not the order waits began). Between
// ticks it
// - spins by re-posting itself to the strand while it has made progress (a
//   new wait or a completion) within `spin`, so other strand work still runs
//   between ticks;
// - then backs off on a timer, doubling from `min_backoff` up to
//   `max_backoff`, so it never sleeps longer than that while an event is
//   outstanding; a new wait cuts a sleep short;
// - does nothing at all when nothing is outstanding (no timer, no posts).
//
// Poll sources (Seastar's pollers) are checked on every tick as well: the
// engine's submissions (HandoffQueue). Work a source finds is progress, and
// while a source is registered the poller keeps spinning for `idle_spin`
// after the last progress even with no event outstanding, so an engine that
// posts every few milliseconds finds the strand awake and does not pay a
// cross-CPU wake-up (its cost: the reactor's core stays busy meanwhile). Before it sleeps (on its timer, or stopping) it tells every
// source, which from then on wakes it (wake()) when work arrives.
//
// A wait completes with an error_code, never an exception: empty when the
// event completed, the device error when the work before it failed, and
// std::errc::operation_canceled when the wait was cancelled (per-operation
// cancellation slot, emitted on the strand) or the poller shut down.
//
// Everything here runs on the strand; async_ready() may be called from any
// executor (it hops to the strand). The Event must outlive the wait.
#pragma once

#include "common/strand.hpp"

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <system_error>

namespace kvstrand::device {
class Event;
}

namespace kvstrand::reactor {

namespace asio = boost::asio;
using common::Strand;


struct PollerOptions {
  std::chrono::microseconds spin{2000};
  // How long sources alone (no event outstanding) keep the poller spinning;
  // 0: it sleeps at once, and the next item pays a wake-up.
  std::chrono::microseconds idle_spin{2000};
  std::chrono::microseconds min_backoff{10};
  std::chrono::microseconds max_backoff{200};
};

struct PollerStats {
  std::uint64_t ticks = 0;
  std::uint64_t spin_ticks = 0;   // ticks scheduled by re-posting
  std::uint64_t timer_ticks = 0;  // ticks scheduled on the backoff timer
  std::uint64_t completed = 0;    // waits that ended with the event complete
  std::uint64_t failed = 0;       // waits that ended with a device error
  std::uint64_t cancelled = 0;
  std::size_t outstanding = 0;
  std::size_t max_outstanding = 0;
};

// Something the poller checks on every tick (all three on the strand).
class PollSource {
 public:
  virtual ~PollSource() = default;
  // Takes what arrived; whether anything did.
  virtual bool poll() = 0;
  // The poller is about to stop ticking: from now on the producer must call
  // Poller::wake() for new work. False when work arrived meanwhile (the
  // poller stays awake).
  virtual bool sleep() = 0;
  // The poller ticks again: producers need not wake it.
  virtual void awake() = 0;
};

class Poller {
 public:
  using Handler = asio::any_completion_handler<void(std::error_code)>;

  explicit Poller(Strand strand, PollerOptions options = {});
  // Cancels outstanding waits on the strand (if it still runs).
  ~Poller();
  Poller(const Poller&) = delete;
  Poller& operator=(const Poller&) = delete;

  template <asio::completion_token_for<void(std::error_code)> Token>
  auto async_ready(const device::Event& event, Token&& token) {
    return asio::async_initiate<Token, void(std::error_code)>(
        [this, ev = &event](auto handler) { start_wait(ev, Handler(std::move(handler))); }, token);
  }

  // The awaitable form: `std::error_code ec = co_await poller.ready(ev);`
  auto ready(const device::Event& event) { return async_ready(event, asio::use_awaitable); }

  // On the strand: completes every outstanding wait with operation_canceled;
  // later waits complete at once the same way. Drops every poll source.
  void shutdown();

  // On the strand: checks `source` on every tick from now on.
  void add_source(std::shared_ptr<PollSource> source);
  // Any thread: makes the poller tick now (a sleeping one resumes spinning).
  void wake();
  // On the strand: the same, without a post. For work that announces more
  // (a lookup's answer: the engine's load follows), so the poller is
  // spinning for `idle_spin` when it comes and no cross-CPU wake-up is paid.
  void kick();

  // On the strand.
  PollerStats stats() const;
  const Strand& strand() const noexcept;

 private:
  void start_wait(const device::Event* event, Handler handler);

  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvstrand::reactor
