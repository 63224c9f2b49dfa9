// The L2's Redis client (src/l2) against real redis-server processes: key
// slots, seed URLs, a standalone server, a 3-master cluster with routing,
// ASK during a slot migration and MOVED after it, and masters SIGKILLed and
// SIGSTOPped under it: nothing waits past the timeout, nothing wrong comes
// back, and a continued master answers again.
#include <catch2/catch.hpp>

#include <algorithm>
#include <csignal>
#include <optional>
#include <thread>

#include "l2/key_slot.hpp"
#include "l2/redis_cluster.hpp"
#include "redis_client.hpp"
#include "redis_nodes.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using l2::RedisErrc;
using l2::RedisResult;
using l2::RedisValue;

namespace {

std::string value_of(int i) {
  // Binary: zero bytes and every byte value, a length that varies.
  std::string v(100 + i % 37, '\0');
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = static_cast<char>((i * 31 + k * 7) & 0xff);
  return v;
}

Commands sets(int n, const std::string& prefix) {
  Commands c;
  for (int i = 0; i < n; ++i) c.push_back({"SET", prefix + std::to_string(i), value_of(i)});
  return c;
}
Commands gets(int n, const std::string& prefix) {
  Commands c;
  for (int i = 0; i < n; ++i) c.push_back({"GET", prefix + std::to_string(i)});
  return c;
}

void require_stored(const std::vector<RedisResult>& r) {
  for (const auto& x : r) {
    INFO(x.why << " " << x.value.str);
    REQUIRE(x.answered());
    REQUIRE(x.value.kind == RedisValue::Kind::status);
    REQUIRE(x.value.str == "OK");
  }
}

void require_values(const std::vector<RedisResult>& r, int first = 0) {
  for (std::size_t i = 0; i < r.size(); ++i) {
    INFO("key " << i << ": " << r[i].why << " " << r[i].value.str);
    REQUIRE(r[i].answered());
    REQUIRE(r[i].value.kind == RedisValue::Kind::string);
    REQUIRE(r[i].value.str == value_of(first + static_cast<int>(i)));
  }
}

// A 3-master cluster holding "k0".."k299", and a client with a 300 ms timeout.
struct StoredCluster {
  StoredCluster() {
    REQUIRE_FALSE(c.start());
    require_stored(c.run(sets(300, "k")));
  }
  // GETs of every key, which must end within the timeout (with room for a
  // loaded machine): a property of the client, not a figure.
  std::vector<RedisResult> bounded_gets() {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c.run(gets(300, "k"));
    const auto took = std::chrono::steady_clock::now() - t0;
    INFO("took " << std::chrono::duration<double>(took).count() << " s");
    REQUIRE(took < 300ms + 2s);
    return r;
  }
  RedisNodes redis{3, true};
  RedisTestClient c{redis.url(), 300ms};
};

// GETs of "k0".."kN": those on `node` failed (with `how`, if given: an
// error, never a value), every other one is its exact value. How many failed.
int require_only_node_lost(RedisTestClient& c, const RedisNodes& redis, const std::vector<RedisResult>& r, int node,
                           std::optional<RedisErrc> how) {
  int lost = 0;
  for (std::size_t i = 0; i < r.size(); ++i) {
    INFO("key " << i << " " << r[i].why);
    if (redis.index_of(c.node_of("k" + std::to_string(i))) != node) {
      require_values({r[i]}, static_cast<int>(i));
      continue;
    }
    ++lost;
    REQUIRE_FALSE(r[i].answered());
    if (how) REQUIRE(r[i].ec == *how);
  }
  return lost;
}

}  // namespace

TEST_CASE("redis: key slots are CRC16 (XMODEM) of the key or its hash tag, modulo 16384", "[l2]") {
  REQUIRE(l2::crc16("123456789") == 0x31C3);  // the specification's check value
  REQUIRE(l2::key_slot("123456789") == 12739);
  REQUIRE(l2::key_slot("foo") == 12182);
  REQUIRE(l2::key_slot("{user1000}.following") == l2::key_slot("{user1000}.followers"));
  REQUIRE(l2::key_slot("{user1000}.following") == l2::key_slot("user1000"));
  REQUIRE(l2::key_slot("foo{}{bar}") == l2::crc16("foo{}{bar}") % 16384);  // an empty tag: the whole key
  REQUIRE(l2::key_slot("foo{{bar}}zap") == l2::crc16("{bar") % 16384);    // up to the first '}'
  REQUIRE(l2::key_slot("foo{bar}{zap}") == l2::key_slot("bar"));           // the first tag only
  REQUIRE(l2::key_slot(std::string("\0\xff", 2)) == l2::crc16(std::string("\0\xff", 2)) % 16384);
}

TEST_CASE("redis: seed URLs are parsed, or refused saying why", "[l2]") {
  auto one = l2::parse_redis_url("redis://127.0.0.1:7000");
  REQUIRE(one.has_value());
  REQUIRE(*one == std::vector<l2::RedisAddress>{{"127.0.0.1", 7000}});
  auto three = l2::parse_redis_url("redis://10.0.0.1:1,10.0.0.2:65535,127.0.0.1:6379");
  REQUIRE(three.has_value());
  REQUIRE(three->size() == 3);
  REQUIRE((*three)[1] == l2::RedisAddress{"10.0.0.2", 65535});
  for (const char* bad : {"127.0.0.1:7000", "redis://", "redis://127.0.0.1", "redis://127.0.0.1:0",
                          "redis://127.0.0.1:65536", "redis://127.0.0.1:70x", "redis://localhost:6379",
                          "redis://127.0.0.1:7000,", "redis://:7000"}) {
    INFO(bad);
    const auto refused = l2::parse_redis_url(bad);
    REQUIRE_FALSE(refused.has_value());
    REQUIRE_FALSE(refused.why().empty());
  }
  REQUIRE(l2::parse_redis_url("redis://localhost:6379").why().find("host names are not resolved") != std::string::npos);
}

TEST_CASE("redis: one non-cluster server: pipelined SET and GET are byte-exact, a missing key is nil", "[l2]") {
  if (!redis_present()) return;
  RedisNodes redis(1, false);
  RedisTestClient c(redis.url());
  REQUIRE_FALSE(c.start());
  REQUIRE_FALSE(c.stats().cluster);
  require_stored(c.run(sets(500, "k")));
  require_values(c.run(gets(500, "k")));
  auto miss = c.run({{"GET", "never-stored"}});
  REQUIRE(miss[0].answered());
  REQUIRE(miss[0].value.kind == RedisValue::Kind::nil);
  auto err = c.run({{"INCR", "k1"}});  // not an integer: Redis's own error, as a value
  REQUIRE(err[0].answered());
  REQUIRE(err[0].value.is_error());
  REQUIRE(c.run({}).empty());
  REQUIRE(c.stats().commands == 1003);  // with start's CLUSTER SLOTS
  REQUIRE(c.stats().connects == 1);  // one connection, every command pipelined on it
}

TEST_CASE("redis: a seed nobody listens on: start fails as unreachable, commands fail, nothing hangs", "[l2]") {
  int port = 0;
  for (int p = 39000; p < 39100 && port == 0; ++p)
    if (port_free(p)) port = p;
  RedisTestClient c("redis://127.0.0.1:" + std::to_string(port), 200ms);
  REQUIRE(c.start() == RedisErrc::unreachable);
  auto r = c.run({{"GET", "a"}});
  REQUIRE(r[0].ec == RedisErrc::no_node);
}

TEST_CASE("redis cluster: 3 masters: every key on its slot's node, pipelined, byte-exact", "[l2][cluster]") {
  if (!redis_present()) return;
  RedisNodes redis(3, true);
  RedisTestClient c(redis.url());
  REQUIRE_FALSE(c.start());
  const auto st = c.stats();
  REQUIRE(st.cluster);
  REQUIRE(st.nodes == 3);
  require_stored(c.run(sets(600, "key:")));
  require_values(c.run(gets(600, "key:")));
  // Routed, not redirected: the slot map was right for every key.
  REQUIRE(c.stats().moved == 0);
  REQUIRE(c.stats().asked == 0);
  std::vector<int> per_node(3, 0);
  Commands slot_of;
  for (int i = 0; i < 600; ++i) {
    const int n = redis.index_of(c.node_of("key:" + std::to_string(i)));
    REQUIRE(n >= 0);
    ++per_node[n];
    if (i < 50) slot_of.push_back({"CLUSTER", "KEYSLOT", "key:" + std::to_string(i)});
  }
  for (int n : per_node) REQUIRE(n > 100);  // spread over all three
  // Each node holds exactly the keys the client routed to it.
  for (int n = 0; n < 3; ++n) REQUIRE(std::stoi(redis.cli(n, {"DBSIZE"})) == per_node[n]);
  // The client's CRC16 is the server's.
  auto slots = c.run(slot_of);
  for (int i = 0; i < 50; ++i) REQUIRE(slots[i].value.integer == l2::key_slot("key:" + std::to_string(i)));
  // Commands sent to a node by its address, not routed by key: each master
  // once, each holding what was routed to it; an address that is none is
  // answered no_node.
  const std::vector<std::string> masters = c.masters();
  REQUIRE(masters.size() == 3);
  std::vector<std::pair<std::string, std::vector<std::string>>> sizes;
  for (const std::string& m : masters) sizes.push_back({m, {"DBSIZE"}});
  sizes.push_back({"nonsense", {"DBSIZE"}});
  const auto r = c.run_on(sizes);
  for (std::size_t m = 0; m < masters.size(); ++m) REQUIRE(r[m].value.integer == per_node[redis.index_of(masters[m])]);
  REQUIRE(r[3].ec == l2::RedisErrc::no_node);
}

TEST_CASE("redis cluster: ASK during a slot migration and MOVED after it are followed to the right bytes",
          "[l2][cluster]") {
  if (!redis_present()) return;
  RedisNodes redis(3, true);
  RedisTestClient c(redis.url());
  REQUIRE_FALSE(c.start());
  // Two keys of one slot (a hash tag), on some node; migrate one of them.
  const std::string a = "{mig}a", b = "{mig}b";
  require_stored(c.run({{"SET", a, value_of(1)}, {"SET", b, value_of(2)}}));
  const int from = redis.index_of(c.node_of(a));
  REQUIRE(from >= 0);
  const int to = (from + 1) % 3;
  const std::string slot = std::to_string(l2::key_slot(a));
  redis.cli(to, {"CLUSTER", "SETSLOT", slot, "IMPORTING", redis.node_id(from)});
  redis.cli(from, {"CLUSTER", "SETSLOT", slot, "MIGRATING", redis.node_id(to)});
  redis.cli(from, {"MIGRATE", "127.0.0.1", std::to_string(redis.port(to)), a, "0", "5000"});

  // Mid-migration: `a` answers ASK (it is on `to`), `b` is still served by `from`.
  auto mid = c.run({{"GET", a}, {"GET", b}});
  require_values({mid[0]}, 1);
  require_values({mid[1]}, 2);
  REQUIRE(c.stats().asked == 1);
  REQUIRE(c.stats().moved == 0);
  REQUIRE(redis.index_of(c.node_of(a)) == from);  // an ASK does not change the map

  redis.cli(from, {"MIGRATE", "127.0.0.1", std::to_string(redis.port(to)), b, "0", "5000"});
  for (int n = 0; n < 3; ++n) redis.cli(n, {"CLUSTER", "SETSLOT", slot, "NODE", redis.node_id(to)});
  // Done: the client's map is stale, `from` answers MOVED, the client follows and learns.
  auto after = c.run({{"GET", a}, {"GET", b}});
  require_values({after[0]}, 1);
  require_values({after[1]}, 2);
  REQUIRE(c.stats().moved >= 1);
  REQUIRE(redis.index_of(c.node_of(b)) == to);
  auto again = c.run({{"GET", a}});
  require_values(again, 1);
}

TEST_CASE("redis cluster: a master SIGKILLed: its keys fail within the timeout, the others answer, restarted, it serves again",
          "[l2][cluster][fault]") {
  if (!redis_present()) return;
  StoredCluster sc;
  auto& [redis, c] = sc;
  const int dead = 1;
  redis.kill(dead);
  for (int round = 0; round < 3; ++round)
    REQUIRE(require_only_node_lost(c, redis, sc.bounded_gets(), dead, std::nullopt) > 30);
  // Back (empty): the client reconnects; its keys are misses (nil), then
  // stored and read again.
  redis.restart(dead);
  std::vector<RedisResult> r;
  for (int tries = 0; tries < 50; ++tries) {  // until the client's retry interval has passed
    r = c.run(gets(300, "k"));
    if (std::all_of(r.begin(), r.end(), [](const RedisResult& x) { return x.answered(); })) break;
    std::this_thread::sleep_for(100ms);
  }
  for (int i = 0; i < 300; ++i) {
    INFO("key " << i << " " << r[i].why);
    REQUIRE(r[i].answered());
    if (redis.index_of(c.node_of("k" + std::to_string(i))) == dead) REQUIRE(r[i].value.kind == RedisValue::Kind::nil);
    else require_values({r[i]}, i);
  }
  require_stored(c.run(sets(300, "k")));
  require_values(c.run(gets(300, "k")));
}

TEST_CASE("redis cluster: a master SIGSTOPped: its keys time out, the others answer, continued, it answers again",
          "[l2][cluster][fault]") {
  if (!redis_present()) return;
  StoredCluster sc;
  auto& [redis, c] = sc;
  const int stopped = 2;
  redis.signal(stopped, SIGSTOP);
  REQUIRE(require_only_node_lost(c, redis, sc.bounded_gets(), stopped, RedisErrc::timeout) > 30);
  REQUIRE(c.stats().timeouts > 30);
  redis.signal(stopped, SIGCONT);
  require_values(c.run(gets(300, "k")));  // all of them, the late answers to the stopped ones dropped
}

TEST_CASE("redis cluster: a MOVED reply moves its slot in the client's map at once, before any refresh",
          "[l2][cluster]") {
  if (!redis_present()) return;
  RedisNodes redis(3, true);
  // No refresh of the slot map for a minute after start: what routes the
  // second GET is the MOVED reply alone.
  RedisTestClient c(redis.url(), 500ms, 60s);
  REQUIRE_FALSE(c.start());
  const std::string a = "{moved}a";
  require_stored(c.run({{"SET", a, value_of(1)}}));
  const int from = redis.index_of(c.node_of(a));
  const int to = (from + 1) % 3;
  const std::string slot = std::to_string(l2::key_slot(a));
  redis.cli(to, {"CLUSTER", "SETSLOT", slot, "IMPORTING", redis.node_id(from)});
  redis.cli(from, {"CLUSTER", "SETSLOT", slot, "MIGRATING", redis.node_id(to)});
  redis.cli(from, {"MIGRATE", "127.0.0.1", std::to_string(redis.port(to)), a, "0", "5000"});
  for (int n = 0; n < 3; ++n) redis.cli(n, {"CLUSTER", "SETSLOT", slot, "NODE", redis.node_id(to)});
  require_values(c.run({{"GET", a}}), 1);
  REQUIRE(c.stats().moved == 1);
  REQUIRE(c.stats().refreshes == 1);  // start's only
  REQUIRE(redis.index_of(c.node_of(a)) == to);
  require_values(c.run({{"GET", a}}), 1);
  REQUIRE(c.stats().moved == 1);  // sent to `to` straight away
}

TEST_CASE("redis: commands in flight on a connection that is lost are uncounted: the node takes max_inflight again",
          "[l2][fault]") {
  if (!redis_present()) return;
  RedisNodes redis(1, false);
  RedisTestClient c(redis.url(), 200ms, 100ms, /*max_inflight*/ 4);
  REQUIRE_FALSE(c.start());
  redis.signal(0, SIGSTOP);
  for (const auto& r : c.run(gets(4, "k"))) REQUIRE(r.ec == RedisErrc::timeout);  // all four still in flight
  REQUIRE(c.run(gets(1, "k"))[0].ec == RedisErrc::overloaded);
  redis.kill(0);  // the connection is lost with the four unanswered
  redis.restart(0);
  std::vector<RedisResult> r;
  for (int tries = 0; tries < 50; ++tries) {  // until the client's retry interval has passed
    r = c.run(gets(4, "k"));
    if (std::all_of(r.begin(), r.end(), [](const RedisResult& x) { return x.answered(); })) break;
    std::this_thread::sleep_for(100ms);
  }
  for (const auto& x : r) {
    INFO(x.why);
    REQUIRE(x.answered());
    REQUIRE(x.value.kind == RedisValue::Kind::nil);
  }
}
