#include "reactor/poller.hpp"

#include <boost/asio/append.hpp>
#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <list>
#include <thread>
#include <utility>
#include <vector>

#include "device/event.hpp"

namespace kvstrand::reactor {

namespace {
using Clock = std::chrono::steady_clock;

std::error_code canceled() { return std::make_error_code(std::errc::operation_canceled); }

// Spin ticks between two yields of the CPU (schedule()).
constexpr std::uint32_t kYieldEvery = 16;
}  // namespace

struct Poller::Impl : std::enable_shared_from_this<Poller::Impl> {
  // Boost 1.81's any_completion_handler must never be copied or
  // move-assigned: its move assignment goes through its unconstrained
  // converting constructor and wraps the handler in itself without end
  // (stack overflow). So these types only move-construct (noexcept, so
  // vectors relocate by moving), assignment is deleted, and waiters live in
  // a std::list, which erases without shifting elements.
  struct Waiter {
    const device::Event* event = nullptr;
    Handler handler;
    std::uint64_t id = 0;
    asio::cancellation_slot slot;

    Waiter(const device::Event* e, Handler h, std::uint64_t i, asio::cancellation_slot s) noexcept
        : event(e), handler(std::move(h)), id(i), slot(s) {}
    Waiter(Waiter&&) noexcept = default;
    Waiter& operator=(Waiter&&) = delete;
    Waiter(const Waiter&) = delete;
    Waiter& operator=(const Waiter&) = delete;
  };
  struct Completion {
    Handler handler;
    std::error_code ec;

    Completion(Handler h, std::error_code e) noexcept : handler(std::move(h)), ec(e) {}
    Completion(Completion&&) noexcept = default;
    Completion& operator=(Completion&&) = delete;
    Completion(const Completion&) = delete;
    Completion& operator=(const Completion&) = delete;
  };

  Impl(Strand s, PollerOptions o) : strand(std::move(s)), timer(strand), options(o), backoff(o.min_backoff) {}

  void add(const device::Event* event, Handler handler) {
    if (stopped) {
      ++stats.cancelled;
      deliver_one(std::move(handler), canceled());
      return;
    }
    const std::uint64_t id = next_id++;
    asio::cancellation_slot slot = asio::get_associated_cancellation_slot(handler);
    if (slot.is_connected()) {
      slot.template emplace<CancelHandler>(weak_from_this(), id);
    }
    waiters.emplace_back(event, std::move(handler), id, slot);
    stats.max_outstanding = std::max(stats.max_outstanding, waiters.size());
    progress();
    if (!running) {
      running = true;
      post_tick();
    } else if (timer_armed) {
      timer.cancel();  // cut the backoff sleep short; the handler ticks
    }
  }

  void tick() {
    ++stats.ticks;
    for (const auto& s : sources)
      if (s->poll()) progress();
    std::vector<Completion> ready;
    for (auto it = waiters.begin(); it != waiters.end();) {
      device::Status st = it->event->query();
      if (st.code() == device::Errc::not_ready) {
        ++it;
        continue;
      }
      it->slot.clear();
      if (st.ok()) {
        ++stats.completed;
      } else {
        ++stats.failed;
      }
      ready.emplace_back(std::move(it->handler), st.code());
      it = waiters.erase(it);
    }
    if (!ready.empty()) progress();
    // Resumed coroutines may start new waits or shut the poller down; both
    // only touch `waiters`, never the local list being delivered.
    for (Completion& c : ready) deliver_one(std::move(c.handler), c.ec);
    schedule();
  }

  void schedule() {
    if (stopped || (waiters.empty() && sources.empty())) {
      running = false;
      return;
    }
    // With nothing outstanding, only the sources are polled: for idle_spin.
    const auto window = waiters.empty() ? options.idle_spin : options.spin;
    if (Clock::now() - last_progress < window || !sources_sleep()) {
      ++stats.spin_ticks;
      for (const auto& s : sources) s->awake();
      // The thread that completes the work we wait for (a runtime callback
      // thread, the sim's stream thread, the engine thread posting work) is
      // often woken onto this CPU; yielding lets it run soon rather than when
      // the scheduler next balances, which on a 2-core machine was the whole
      // spin window (docs/PERFORMANCE.md). Every kYieldEvery-th tick only:
      // the system call lengthens every tick (a tick took 3-4 times as long
      // with it on this 2-core VM, a quarter longer on an H100 host), and a
      // tick's length is how late a submission or a completion is seen.
      if (++ticks_since_yield >= kYieldEvery) {
        ticks_since_yield = 0;
        std::this_thread::yield();
      }
      post_tick();
      return;
    }
    if (waiters.empty()) {  // only sources, and each now wakes us
      running = false;
      return;
    }
    ++stats.timer_ticks;
    timer.expires_after(backoff);
    backoff = std::min(backoff * 2, options.max_backoff);
    timer_armed = true;
    timer.async_wait([self = shared_from_this()](const boost::system::error_code&) {
      self->timer_armed = false;
      self->tick();
    });
  }

  // Whether every source agreed to wake the poller from now on (false: one
  // had work meanwhile, which is progress).
  bool sources_sleep() {
    for (const auto& s : sources)
      if (!s->sleep()) {
        progress();
        return false;
      }
    return true;
  }

  // A source's producer found it asleep: tick now.
  void kick() {
    if (stopped) return;
    progress();
    if (!running) {
      running = true;
      post_tick();
    } else if (timer_armed) {
      timer.cancel();  // the handler ticks
    }
  }

  void post_tick() {
    asio::post(strand, [self = shared_from_this()] { self->tick(); });
  }

  void progress() {
    last_progress = Clock::now();
    backoff = options.min_backoff;
  }

  void cancel(std::uint64_t id) {
    for (auto it = waiters.begin(); it != waiters.end(); ++it) {
      if (it->id != id) continue;
      Handler h = std::move(it->handler);
      it->slot.clear();
      waiters.erase(it);
      ++stats.cancelled;
      deliver_one(std::move(h), canceled());
      return;
    }
  }

  void shutdown() {
    stopped = true;
    timer.cancel();
    sources.clear();
    std::list<Waiter> all;
    all.swap(waiters);
    for (Waiter& w : all) {
      w.slot.clear();
      ++stats.cancelled;
      deliver_one(std::move(w.handler), canceled());
    }
  }

  static void deliver_one(Handler h, std::error_code ec) {
    // Resumes the waiter on its own executor: inline when that is this strand.
    asio::dispatch(asio::append(std::move(h), ec));
  }

  struct CancelHandler {
    std::weak_ptr<Impl> impl;
    std::uint64_t id;
    CancelHandler(std::weak_ptr<Impl> i, std::uint64_t n) : impl(std::move(i)), id(n) {}
    void operator()(asio::cancellation_type_t) {
      if (auto p = impl.lock()) p->cancel(id);
    }
  };

  Strand strand;
  asio::steady_timer timer;
  PollerOptions options;
  std::list<Waiter> waiters;
  std::vector<std::shared_ptr<PollSource>> sources;
  bool running = false;  // a tick is posted, armed on the timer, or executing
  bool timer_armed = false;
  bool stopped = false;
  std::uint32_t ticks_since_yield = 0;
  std::uint64_t next_id = 1;
  std::chrono::microseconds backoff;
  Clock::time_point last_progress{};
  PollerStats stats;
};

Poller::Poller(Strand strand, PollerOptions options)
    : impl_(std::make_shared<Impl>(std::move(strand), options)) {}

Poller::~Poller() {
  asio::dispatch(impl_->strand, [impl = impl_] { impl->shutdown(); });
}

void Poller::start_wait(const device::Event* event, Handler handler) {
  asio::dispatch(impl_->strand, [impl = impl_, event, h = std::move(handler)]() mutable {
    impl->add(event, std::move(h));
  });
}

void Poller::shutdown() { impl_->shutdown(); }

void Poller::add_source(std::shared_ptr<PollSource> source) {
  if (impl_->stopped) return;
  impl_->sources.push_back(std::move(source));  // it starts asleep: its producer's first item wakes us
}

void Poller::wake() {
  asio::post(impl_->strand, [impl = impl_] { impl->kick(); });
}

void Poller::kick() { impl_->kick(); }

PollerStats Poller::stats() const {
  PollerStats s = impl_->stats;
  s.outstanding = impl_->waiters.size();
  return s;
}

const Strand& Poller::strand() const noexcept { return impl_->strand; }

}  // namespace kvstrand::reactor
