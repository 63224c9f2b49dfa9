// The reactor: one io_context, one thread, one strand that owns all transfer
// state, with the strand's Poller and EventPool.
//
// Everything reached through poller(), events() and strand work runs on the
// reactor thread. Other threads only post to the strand (or use call() for
// set-up and tear-down, which blocks them; never call it from the strand).
#pragma once

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <memory>
#include <optional>
#include <thread>

#include "device/event_pool.hpp"
#include "device/status.hpp"
#include "reactor/poller.hpp"

namespace kvstrand::reactor {

struct ReactorOptions {
  int device = 0;
  std::size_t warm_events = 16;
  PollerOptions poller;
};

class Reactor {
 public:
  // Throws std::invalid_argument naming `device` when the reactor
  // thread cannot select that device.
  explicit Reactor(ReactorOptions options);
  ~Reactor();
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  Strand& strand() noexcept { return strand_; }
  // For I/O objects (sockets, timers, signals) whose handlers run on the strand.
  asio::io_context& context() noexcept { return ctx_; }
  Poller& poller() noexcept { return *poller_; }     // on the strand
  device::EventPool& events() noexcept { return *pool_; }  // on the strand
  bool on_strand() const noexcept { return strand_.running_in_this_thread(); }

  // Runs `make()`'s coroutine on the strand and blocks until it finishes.
  template <class MakeAwaitable>
  auto call(MakeAwaitable make) {
    return common::call_on(strand_, std::move(make));
  }

  // Shuts the poller down, destroys the event pool on the strand, stops the
  // io_context (abandoning handlers still pending) and joins the thread.
  // Idempotent. The Connector calls it only once every transfer is terminal.
  void stop();

 private:
  ReactorOptions options_;
  asio::io_context ctx_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  Strand strand_;
  std::unique_ptr<Poller> poller_;
  std::optional<device::EventPool> pool_;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace kvstrand::reactor
