// A named wake-up on one strand, a condition variable for coroutines:
// wait() suspends until the next notify() or a deadline; notify() wakes
// every coroutine waiting at that moment. Owners used to write this out
// each time as a timer set far ahead and cancelled to wake whoever waited.
//
// A waiter checks its condition and then waits, with no co_await between:
// on one strand nothing runs in between, so no notify() is lost, and a
// notify() with nobody waiting does nothing. The Notifier must outlive its
// waiters (its owner closes its gate, or notifies, before it goes).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>

#include "common/await_codes.hpp"
#include "common/strand.hpp"

namespace kvstrand::common {

class Notifier {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Notifier(Strand strand) : strand_(std::move(strand)) {}
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  // Until the next notify() (true) or `until` (false). A cancelled waiting
  // coroutine also ends it, false.
  boost::asio::awaitable<bool> wait(Clock::time_point until = Clock::time_point::max()) {
    Waiter w(strand_, until);
    link(w);
    struct Unlink {
      Notifier& n;
      Waiter& w;
      ~Unlink() { n.unlink(w); }  // also when the frame is destroyed unresumed
    } unlink{*this, w};
    co_await w.timer.async_wait(kAwait);
    co_return w.notified;
  }

  boost::asio::awaitable<bool> wait_for(Clock::duration d) { return wait(Clock::now() + d); }

  // Until done() holds (true) or `until` has passed (false), woken by each
  // notify() to look again. Name `done` before the co_await (GCC 12: see
  // docs/development.md, "Coroutines and GCC 12").
  template <class Done>
  boost::asio::awaitable<bool> wait_until(Done done, Clock::time_point deadline) {
    while (!done() && Clock::now() < deadline) co_await wait(deadline);
    co_return done();
  }

  void notify() {
    for (Waiter* w = first_; w != nullptr; w = w->next) {
      w->notified = true;
      w->timer.cancel();  // its completion is posted: the list is not changed here
    }
  }

  std::size_t waiting() const noexcept { return waiting_; }

 private:
  // Lives in the waiting coroutine's frame: no allocation per wait.
  struct Waiter {
    Waiter(Strand& s, Clock::time_point until) : timer(s, until) {}
    boost::asio::steady_timer timer;
    bool notified = false;
    Waiter* prev = nullptr;
    Waiter* next = nullptr;
  };

  void link(Waiter& w) {
    w.next = first_;
    if (first_ != nullptr) first_->prev = &w;
    first_ = &w;
    ++waiting_;
  }

  void unlink(Waiter& w) {
    (w.prev != nullptr ? w.prev->next : first_) = w.next;
    if (w.next != nullptr) w.next->prev = w.prev;
    --waiting_;
  }

  Strand strand_;
  Waiter* first_ = nullptr;
  std::size_t waiting_ = 0;
};

}  // namespace kvstrand::common
