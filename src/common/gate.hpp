// One way to stop things (Seastar's gate, stdexec's async_scope): every
// coroutine an owner starts in the background runs inside the owner's gate;
// close() refuses what would start after it and completes once everything
// inside has ended, or at its bound. All on one strand.
//
// The owner must outlive what runs inside its gate (each coroutine names its
// owner); closing before the owner goes is what makes that true.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <chrono>
#include <cstddef>
#include <exception>
#include <utility>

#include "common/notifier.hpp"
#include "common/strand.hpp"

namespace kvstrand::common {

class Gate {
 public:
  explicit Gate(Strand strand) : strand_(std::move(strand)), emptied_(strand_) {}
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // Starts `work` (an awaitable) on the strand inside the gate; `done` is its
  // co_spawn completion (the exception first). False, and nothing started,
  // once the gate is closing.
  template <class Awaitable, class Done>
  bool spawn(Awaitable work, Done done) {
    if (closing_) return false;
    ++inside_;
    boost::asio::co_spawn(strand_, std::move(work), [this, done = std::move(done)](auto&&... result) mutable {
      done(std::forward<decltype(result)>(result)...);
      leave();
    });
    return true;
  }

  bool closing() const noexcept { return closing_; }
  std::size_t inside() const noexcept { return inside_; }

  // Refuses new work; completes once nothing is inside (true) or when
  // `bound` has passed first (false: something is still running).
  boost::asio::awaitable<bool> close(std::chrono::steady_clock::duration bound) {
    closing_ = true;
    auto empty = [this] { return inside_ == 0; };
    co_return co_await emptied_.wait_until(empty, std::chrono::steady_clock::now() + bound);
  }

 private:
  void leave() {
    if (--inside_ == 0) emptied_.notify();
  }

  Strand strand_;
  Notifier emptied_;
  std::size_t inside_ = 0;
  bool closing_ = false;
};

}  // namespace kvstrand::common
