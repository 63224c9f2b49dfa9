// A namespace dropped on a node with --l2 (an online weight update, an
// operator's --drop-namespace): its values deleted from every master, the
// scan skipped where no node ever wrote it, and nothing of it promoted
// until its purge has reached every master (one paused, one stopped).
#include <catch2/catch.hpp>

#include <csignal>
#include <thread>

#include "l2_node.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;

TEST_CASE("l2: a namespace drop deletes its values from every master: another node no longer loads them",
          "[l2][server]") {
  if (!redis_present() || !curl_present()) return;
  RedisNodes redis(3, true);
  Node a(redis.url()), b(redis.url());
  const auto stored = store_prompts(a, redis, 12);
  REQUIRE(must_call(a.c, Drop{kv::namespace_of(layout())}).status == Status::ok);
  eventually([&] { return redis_keys(redis) == 0; }, "the namespace's values deleted from every master");
  REQUIRE(a.counter("purged_total") == 12);
  REQUIRE(a.counter("purge_failed_total") == 0);
  for (const auto& [p, bytes] : stored) REQUIRE(b.load(keys(p, 1), {bytes}) == 0);  // b's arena never held them
  // Stored anew after the purge: written behind, and b loads it again.
  const auto again = a.store(keys(1, 1), 1);
  eventually([&] { return redis_keys(redis) == 1; }, "the new value written behind");
  REQUIRE(b.load(keys(1, 1), again) == 1);
}


TEST_CASE("l2: a drop of a namespace no node wrote scans nothing, and a burst of drops all end, none given up",
          "[l2][server]") {
  if (!redis_present() || !curl_present()) return;
  // One drop of a namespace the node never held scanned every master's
  // whole keyspace; 300 at once all gave up, leaving values and the
  // namespaces unpromotable for the server's life.
  RedisNodes redis(3, true);
  Node a(redis.url());
  const auto stored = store_prompts(a, redis, 4);
  std::size_t markers = 0;
  for (int i = 0; i < 3; ++i) markers += redis_markers(redis, i);
  REQUIRE(markers == 1);  // the namespace written, marked once
  std::size_t scans_before = 0;
  for (int i = 0; i < 3; ++i) scans_before += scans_run(redis, i);
  for (int d = 0; d < 300; ++d) {
    kv::Digest never{};
    never[0] = static_cast<std::byte>(d & 0xff);
    never[1] = static_cast<std::byte>(d >> 8);
    never[31] = std::byte{0x5a};
    REQUIRE(must_call(a.c, Drop{never}).status == Status::ok);
  }
  eventually([&] { return a.counter("purges_skipped_total") == 300; }, "every drop's purge ended");
  REQUIRE(a.counter("purges_pending") == 0);
  REQUIRE(a.counter("purge_failed_total") == 0);
  std::size_t scans_after = 0;
  for (int i = 0; i < 3; ++i) scans_after += scans_run(redis, i);
  REQUIRE(scans_after == scans_before);
  REQUIRE(redis_keys(redis) == 4);  // nothing of the written namespace touched
  // The namespace that was written is still purged whole by its drop.
  REQUIRE(must_call(a.c, Drop{kv::namespace_of(layout())}).status == Status::ok);
  eventually([&] { return redis_keys(redis) == 0; }, "the written namespace's values deleted");
  REQUIRE(a.counter("purges_pending") == 0);
}


TEST_CASE("l2: a namespace whose purge has not reached every master is not promoted from one that answers again",
          "[l2][server][fault]") {
  if (!redis_present() || !curl_present()) return;
  RedisNodes redis(3, true);
  Node a(redis.url());
  const auto stored = store_prompts(a, redis, 12);
  RedisTestClient rc(redis.url());
  REQUIRE_FALSE(rc.start());  // the slot map
  std::vector<std::pair<int, std::vector<std::byte>>> on_1;  // the prompts master 1 holds
  for (const auto& [p, bytes] : stored)
    if (master_of(rc, redis, p) == 1) on_1.emplace_back(p, bytes);
  REQUIRE(!on_1.empty());
  // Master 1 pauses its clients a while: the purge's scan of it goes
  // unanswered (--l2-timeout), and is retried a second later.
  const auto paused = std::chrono::steady_clock::now();
  redis.cli(1, {"CLIENT", "PAUSE", "800", "ALL"});
  REQUIRE(must_call(a.c, Drop{kv::namespace_of(layout())}).status == Status::ok);
  eventually([&] { return a.counter("purge_failed_total") >= 1; }, "the paused master's purge failed");
  REQUIRE(a.counter("purges_pending") == 1);
  // It answers again, its values still there until the retry: they are
  // not promoted, nor even asked for.
  std::this_thread::sleep_until(paused + 850ms);
  const double asked = a.counter("lookups_total");
  for (const auto& [p, bytes] : on_1) REQUIRE(a.load(keys(p, 1), {bytes}) == 0);
  REQUIRE(a.counter("lookups_total") == asked);
  REQUIRE(a.counter("promoted_total") == 0);
  eventually([&] { return a.counter("purges_pending") == 0; }, "the purge ended");
  eventually([&] { return redis_keys(redis) == 0; }, "every master's values deleted");
}


TEST_CASE("l2: a purge that fails on a stopped master is retried until it ends, its namespace not promoted meanwhile",
          "[l2][server][fault]") {
  if (!redis_present() || !curl_present()) return;
  // A purge whose master did not answer was given up: its values stayed in
  // Redis and its namespace was never promoted again for the server's life.
  RedisNodes redis(3, true);
  Node a(redis.url());
  const auto stored = store_prompts(a, redis, 12);
  redis.signal(1, SIGSTOP);
  REQUIRE(must_call(a.c, Drop{kv::namespace_of(layout())}).status == Status::ok);
  eventually([&] { return a.counter("purge_failed_total") >= 1; }, "the stopped master's scan failed");
  REQUIRE(a.counter("purges_pending") == 1);  // not given up
  redis.signal(1, SIGCONT);
  eventually([&] { return redis_keys(redis) == 0; }, "every master's values deleted once it answers");
  eventually([&] { return a.counter("purges_pending") == 0; }, "the purge ended");
  // Promoted again only now, and stored anew it is written behind again.
  const auto again = a.store(keys(1, 1), 1);
  eventually([&] { return redis_keys(redis) == 1; }, "the new value written behind");
}

TEST_CASE("l2: a value whose namespace's marker could not be set is not written, and a later save writes both",
          "[l2][server][fault]") {
  if (!redis_present() || !curl_present()) return;
  // A drop scans only the masters a marker says a node wrote the namespace
  // to: a value in Redis without its marker would outlive the drop.
  RedisNodes redis(3, true);
  int marker_master = -1;
  {
    Node a(redis.url());
    store_prompts(a, redis, 1);
    for (int i = 0; i < 3; ++i)
      if (redis_markers(redis, i) == 1) marker_master = i;
  }
  REQUIRE(marker_master >= 0);
  // What the two other masters hold (DBSIZE, a read, is served while writes
  // are paused; no marker is on them).
  auto on_others = [&] {
    std::size_t n = 0;
    for (int i = 0; i < 3; ++i)
      if (i != marker_master) n += std::stoul(redis.cli(i, {"DBSIZE"}));
    return n;
  };
  const std::size_t before = on_others();
  // A fresh node has marked nothing: its first batch sets the marker again,
  // which the marker's master, its writes paused, does not answer in time.
  Node b(redis.url());
  redis.cli(marker_master, {"CLIENT", "PAUSE", "10000", "WRITE"});  // ended below
  for (int p = 2; p <= 13; ++p) b.store(keys(p, 1), p);
  eventually([&] { return b.counter("write_failed_total") >= 12 || on_others() > before; },
             "the batch given up, or written");
  REQUIRE(on_others() == before);
  REQUIRE(b.counter("write_failed_total") == 12);
  redis.cli(marker_master, {"CLIENT", "UNPAUSE"});
  // The next save marks its namespace and is written.
  const std::size_t values = redis_keys(redis);
  const auto again = b.store(keys(14, 1), 14);
  eventually([&] { return redis_keys(redis) == values + 1; }, "the next save written behind");
  REQUIRE(b.load(keys(14, 1), again) == 1);
}
