// What an accept loop does when accept() fails.
//
// Out of descriptors (EMFILE, ENFILE) or memory, the connection stays queued
// and accept() fails again at once: a loop that retries at once spins a core
// until descriptors free up. So a failed accept waits, 10 ms doubling to 1 s,
// and the first failure of a run of them is logged once. A peer that gave up
// before it was accepted (ECONNABORTED) is that peer's own failure: accepted
// again at once. Strand-only, like the loop that owns it.
#pragma once

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "common/await_codes.hpp"
#include "common/strand.hpp"

namespace kvstrand::common {

class AcceptBackoff {
 public:
  explicit AcceptBackoff(Strand& strand) : timer_(strand) {}

  // After a failed accept: returns when the loop may accept again (at once
  // after cancel(), which the loop's stop calls). `errno_value`: the failed
  // accept's ec.value() (an errno: accept's errors are the system's). Read
  // as a number: comparing or describing it through Boost's error category
  // trips UBSan's vptr check on that category under -fvisibility=hidden.
  boost::asio::awaitable<void> failed(int errno_value, const char* who) {
    ++failures_;
    if (errno_value == ECONNABORTED) co_return;
    if (delay_.count() == 0) {
      delay_ = std::chrono::milliseconds(10);
      spdlog::warn("{}: accept failed ({}); retrying with back-off until it succeeds", who,
                   std::strerror(errno_value));
    } else {
      delay_ = std::min<std::chrono::milliseconds>(delay_ * 2, std::chrono::seconds(1));
    }
    timer_.expires_after(delay_);
    co_await timer_.async_wait(kAwait);
  }
  void succeeded() { delay_ = std::chrono::milliseconds(0); }
  void cancel() { timer_.cancel(); }
  std::uint64_t failures() const { return failures_; }

 private:
  boost::asio::steady_timer timer_;
  std::chrono::milliseconds delay_{0};  // 0: the last accept succeeded
  std::uint64_t failures_ = 0;
};

}  // namespace kvstrand::common
