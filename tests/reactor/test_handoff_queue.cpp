// The engine thread's hand-off to the strand: a bounded ring the poller
// takes on every tick, which wakes a sleeping poller and loses nothing.
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include <boost/asio/post.hpp>

#include "reactor/handoff_queue.hpp"
#include "reactor/poller.hpp"
#include "support.hpp"

using namespace kvstrand;
using namespace std::chrono_literals;
namespace asio = boost::asio;
using reactor::HandoffQueue;
using reactor::Poller;

namespace {

// A strand on its own thread with a Poller, as the Reactor has. Catch's
// assertions stay on the test's thread: on_strand only computes.
struct StrandThread {
  asio::io_context ctx;
  asio::executor_work_guard<asio::io_context::executor_type> work{ctx.get_executor()};
  common::Strand strand = asio::make_strand(ctx);
  Poller poller;
  std::thread thread;

  explicit StrandThread(reactor::PollerOptions o) : poller(strand, o) { thread = std::thread([this] { ctx.run(); }); }
  ~StrandThread() {
    asio::post(strand, [this] { poller.shutdown(); });
    work.reset();
    thread.join();
  }
  // Runs f on the strand and waits for it.
  template <class F>
  void on_strand(F f) {
    std::atomic<bool> done{false};
    asio::post(strand, [&] {
      f();
      done = true;
    });
    while (!done) std::this_thread::yield();
  }
  reactor::PollerStats stats() {
    reactor::PollerStats s;
    on_strand([&] { s = poller.stats(); });
    return s;
  }
};

// Waits (bounded) until `pred` holds; whether it did.
template <class P>
bool eventually(P pred, std::chrono::milliseconds bound = 5s) {
  const auto until = std::chrono::steady_clock::now() + bound;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

}  // namespace

TEST_CASE("handoff queue: items reach the strand in order, across wrap-around, and a full ring refuses and keeps the item",
          "[handoff]") {
  StrandThread s({});
  std::vector<int> seen;  // written on the strand only
  auto q = std::make_shared<HandoffQueue<std::vector<int>>>(3, s.poller, [&](std::vector<int>& v) {
    seen.insert(seen.end(), v.begin(), v.end());
  });
  // Not registered with the poller yet: nothing takes the items.
  std::vector<int> item;
  for (int i = 0; i < 4; ++i) {
    item = {i};
    REQUIRE(q->push(item));  // capacity 3 is rounded up to 4
  }
  item = {99, 100};
  REQUIRE_FALSE(q->push(item));
  REQUIRE(item == std::vector<int>{99, 100});
  bool first = false, second = true;
  s.on_strand([&] { first = q->poll(); });
  s.on_strand([&] { second = q->poll(); });
  REQUIRE(first);
  REQUIRE_FALSE(second);
  REQUIRE(q->push(item));
  for (int i = 5; i < 11; ++i) {
    item = {i};
    REQUIRE(q->push(item));
    if (i % 2 == 0) s.on_strand([&] { q->poll(); });
  }
  s.on_strand([&] { q->poll(); });
  REQUIRE(seen == std::vector<int>{0, 1, 2, 3, 99, 100, 5, 6, 7, 8, 9, 10});
}

TEST_CASE("handoff queue: a consumed item goes back to the producer, and a poll inside consume takes nothing",
          "[handoff]") {
  StrandThread s({});
  // Records the thread that destroys it: an item made by the producer must
  // be freed there too, not on the strand.
  struct Tracked {
    std::thread::id* freed_on;
    ~Tracked() { *freed_on = std::this_thread::get_id(); }
  };
  std::thread::id freed_on{};
  std::vector<int> nested;  // written on the strand only
  std::shared_ptr<HandoffQueue<std::unique_ptr<Tracked>>> q;
  q = std::make_shared<HandoffQueue<std::unique_ptr<Tracked>>>(2, s.poller, [&](std::unique_ptr<Tracked>& t) {
    // The item being consumed is not handed out again; it is looked at, not taken.
    nested.push_back(q->poll() ? 1 : t == nullptr ? 2 : 0);
  });
  Tracked* first = new Tracked{&freed_on};
  std::unique_ptr<Tracked> item(first);
  REQUIRE(q->push(item));
  REQUIRE(item == nullptr);  // the slot held nothing before
  s.on_strand([&] { q->poll(); });
  REQUIRE(nested == std::vector<int>{0});
  REQUIRE(freed_on == std::thread::id{});  // still in its slot, on neither thread's books
  std::unique_ptr<Tracked> other;
  REQUIRE(q->push(other));
  REQUIRE(q->push(item));      // lands in the first item's slot...
  REQUIRE(item.get() == first);  // ...and hands the first item back
  REQUIRE(freed_on == std::thread::id{});
  item.reset();
  REQUIRE(freed_on == std::this_thread::get_id());
  s.on_strand([&] { q->poll(); });
  REQUIRE(nested == std::vector<int>{0, 2, 2});
}

TEST_CASE("handoff queue: emplace writes an item in its slot, over the consumed one there, and a full ring "
          "refuses without calling it",
          "[handoff]") {
  StrandThread s({});
  std::vector<std::vector<int>> seen;  // written on the strand only
  auto q = std::make_shared<HandoffQueue<std::vector<int>>>(2, s.poller, [&](std::vector<int>& v) {
    seen.push_back(v);  // looked at, left in its slot
  });
  std::vector<std::vector<int>> found;  // what each emplace found in its slot
  auto put = [&](int x) {
    return q->emplace([&](std::vector<int>& slot) {
      found.push_back(slot);
      slot.assign(3, x);
    });
  };
  REQUIRE(put(1));
  REQUIRE(put(2));
  bool called = false;
  REQUIRE_FALSE(q->emplace([&](std::vector<int>&) { called = true; }));  // full
  REQUIRE_FALSE(called);
  s.on_strand([&] { q->poll(); });
  REQUIRE(seen == std::vector<std::vector<int>>{{1, 1, 1}, {2, 2, 2}});
  REQUIRE(put(3));  // the first slot again: its consumed item is the producer's to write over
  s.on_strand([&] { q->poll(); });
  REQUIRE(found == std::vector<std::vector<int>>{{}, {}, {1, 1, 1}});
  REQUIRE(seen.back() == std::vector<int>{3, 3, 3});
}

TEST_CASE("handoff queue: a consumer that throws drops that item only, and the queue goes on", "[handoff]") {
  StrandThread s({});
  std::vector<int> seen;  // written on the strand only
  auto q = std::make_shared<HandoffQueue<int>>(4, s.poller, [&](int& v) {
    if (v == 1) throw std::runtime_error("consumer failed");
    seen.push_back(v);
  });
  for (int v : {0, 1, 2}) REQUIRE(q->push(v));
  bool threw = false, more = false;
  s.on_strand([&] {
    try {
      q->poll();
    } catch (const std::runtime_error&) {
      threw = true;
    }
  });
  s.on_strand([&] { more = q->poll(); });  // 2, not 1 again
  REQUIRE(threw);
  REQUIRE(more);
  int v = 3;
  REQUIRE(q->push(v));
  s.on_strand([&] { q->poll(); });
  REQUIRE(seen == std::vector<int>{0, 2, 3});
}

TEST_CASE("handoff queue: sleep() refuses while an item waits, and a push to a sleeping queue wakes the poller",
          "[handoff]") {
  reactor::PollerOptions o;
  o.idle_spin = 0us;  // the poller sleeps as soon as it is idle: every push after that must wake it
  StrandThread s(o);
  std::atomic<int> taken{0};
  auto q = std::make_shared<HandoffQueue<int>>(8, s.poller, [&](int&) { ++taken; });
  int item = 1;
  REQUIRE(q->push(item));
  bool slept_with_item = true, slept_empty = false;
  s.on_strand([&] { slept_with_item = q->sleep(); });
  s.on_strand([&] {
    q->poll();
    slept_empty = q->sleep();
  });
  REQUIRE_FALSE(slept_with_item);  // an item waits: the poller must stay awake
  REQUIRE(slept_empty);
  s.on_strand([&] { s.poller.add_source(q); });
  // Each push finds the poller asleep (idle_spin 0): nothing but the push's
  // wake-up makes the strand take it.
  for (int i = 0; i < 20; ++i) {
    REQUIRE(q->push(item));
    REQUIRE(eventually([&] { return taken.load() == i + 2; }));
    std::this_thread::sleep_for(1ms);
  }
}

TEST_CASE("handoff queue: a batch of staged items wakes a sleeping poller once notified, all of it", "[handoff]") {
  reactor::PollerOptions o;
  o.idle_spin = 0us;
  StrandThread s(o);
  std::vector<int> seen;  // written on the strand only
  std::atomic<int> taken{0};
  auto q = std::make_shared<HandoffQueue<int>>(8, s.poller, [&](int& v) {
    seen.push_back(v);
    ++taken;
  });
  s.on_strand([&] { s.poller.add_source(q); });
  for (int round = 0; round < 10; ++round) {
    std::this_thread::sleep_for(2ms);  // the poller is asleep again
    for (int i = 0; i < 3; ++i) REQUIRE(q->stage([&](int& slot) { slot = round * 3 + i; }));
    q->notify();
    REQUIRE(eventually([&] { return taken.load() == round * 3 + 3; }));
  }
  std::vector<int> expected(30);
  for (int i = 0; i < 30; ++i) expected[static_cast<std::size_t>(i)] = i;
  s.on_strand([] {});  // what the strand wrote is seen here after this
  REQUIRE(seen == expected);
}

TEST_CASE("handoff queue: a producer racing the poller's sleeps loses nothing and keeps the order", "[handoff]") {
  // Short spins so the poller goes to sleep and wakes many times while the
  // producer pushes in bursts with pauses of about the spin window.
  reactor::PollerOptions o;
  o.idle_spin = 50us;
  StrandThread s(o);
  std::vector<int> seen;
  std::atomic<std::size_t> count{0};
  auto q = std::make_shared<HandoffQueue<int>>(16, s.poller, [&](int& v) {
    seen.push_back(v);
    count.store(seen.size());
  });
  s.on_strand([&] { s.poller.add_source(q); });
  constexpr int kItems = 20000;
  int next = 0;
  while (next < kItems) {
    const int burst = 1 + next % 7;
    for (int b = 0; b < burst && next < kItems; ++b) {
      int v = next;
      while (!q->push(v)) std::this_thread::yield();  // full: the strand is behind
      ++next;
    }
    if (next % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(next % 120));
  }
  REQUIRE(eventually([&] { return count.load() == kItems; }));
  int first_wrong = -1;
  s.on_strand([&] {
    for (int i = 0; i < kItems && first_wrong < 0; ++i)
      if (seen[i] != i) first_wrong = i;
  });
  REQUIRE(first_wrong == -1);
  const auto st = s.stats();
  INFO("spin ticks " << st.spin_ticks);
  REQUIRE(st.spin_ticks > 0);
}

TEST_CASE("handoff queue: an idle poller stops spinning after idle_spin, and a push starts it again", "[handoff]") {
  reactor::PollerOptions o;
  o.idle_spin = 2ms;
  StrandThread s(o);
  std::atomic<int> taken{0};
  auto q = std::make_shared<HandoffQueue<int>>(4, s.poller, [&](int&) { ++taken; });
  s.on_strand([&] { s.poller.add_source(q); });
  int item = 0;
  REQUIRE(q->push(item));
  REQUIRE(eventually([&] { return taken.load() == 1; }));
  std::this_thread::sleep_for(50ms);  // well past idle_spin
  const auto a = s.stats();
  std::this_thread::sleep_for(50ms);
  const auto b = s.stats();
  REQUIRE(b.ticks == a.ticks);  // asleep: no tick, no timer
  REQUIRE(b.timer_ticks == 0);
  REQUIRE(q->push(item));
  REQUIRE(eventually([&] { return taken.load() == 2; }));
}
