// What a transfer's deadline costs the strand, the two ways TransferTable
// could keep it: a steady_timer of its own (made, awaited, destroyed at the
// transfer's end: what it did), or an entry in a queue in start order
// behind one timer armed for the oldest (what it does). Each way runs N
// transfers one after another on one strand, each started and ended in one
// handler, as a load whose copy ends at once would; the same run times the
// handlers with no deadline at all, the baseline both are given against.
//
// usage: bench_deadlines [N]   (default 200000)
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

enum class Way { none, timer_each, one_timer };

double us_per_transfer(Way way, int n) {
  asio::io_context io(1);
  auto strand = asio::make_strand(io);
  const auto deadline = std::chrono::seconds(60);
  asio::steady_timer one(strand);
  bool armed = false;
  std::deque<std::pair<Clock::time_point, int>> deadlines;
  int done = 0;
  std::function<void()> transfer = [&] {
    const auto due = Clock::now() + deadline;
    if (way == Way::timer_each) {
      auto t = std::make_unique<asio::steady_timer>(strand, due);
      t->async_wait([](const boost::system::error_code&) {});
      t.reset();  // the transfer ended: its timer goes, which cancels the wait
    } else if (way == Way::one_timer) {
      deadlines.emplace_back(due, done);
      if (!armed) {
        armed = true;
        one.expires_at(deadlines.front().first);
        one.async_wait([](const boost::system::error_code&) {});
      }
      deadlines.pop_front();  // the transfer ended: the oldest, so its entry goes at once
    }
    if (++done < n) asio::post(strand, transfer);
    else one.cancel();
  };
  const auto t0 = Clock::now();
  asio::post(strand, transfer);
  io.run();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::stoi(argv[1]) : 200000;
  us_per_transfer(Way::timer_each, n / 10);  // warm-up: the allocators and the timerfd
  const double none = us_per_transfer(Way::none, n);
  const double each = us_per_transfer(Way::timer_each, n);
  const double one = us_per_transfer(Way::one_timer, n);
  std::printf("%d transfers on one strand, us each: no deadline %.3f; a timer each %.3f; one timer over a queue %.3f\n",
              n, none, each, one);
  std::printf("deadline cost per transfer us: a timer each %.3f, one timer over a queue %.3f (ratio %.2f)\n",
              each - none, one - none, (one - none) / (each - none));
}
