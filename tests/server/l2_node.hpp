// The L2 tests' nodes (test_l2_tier, test_l2_drops): kvstrand-servers
// with --l2 on a real Redis Cluster (RedisNodes), each with a session whose
// arena the test maps, its L2 counters read from /metrics; the values and
// markers Redis holds, counted with redis-cli.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "curl.hpp"
#include "l2/chunk_value.hpp"
#include "protocol_session.hpp"
#include "redis_client.hpp"
#include "redis_nodes.hpp"

namespace kvstrand::test {

inline constexpr auto kL2Timeout = std::chrono::milliseconds(300);

// A node: a kvstrand-server on the cluster, with one session whose arena
// this test maps, and its debug endpoint for the L2 counters.
struct Node {
  explicit Node(const std::string& url, std::vector<std::string> extra = {})
      : port(free_port()), srv(flags(url, port, std::move(extra))), ready(srv.ready()), c(srv.socket_path()) {
    REQUIRE(ready);
    eventually([&] { return stats(srv.socket_path()).ready_bytes == 16u << 20; }, "every slab ready");
    // Until it has the slot map a server serves without L2 (by design: it
    // never waits for Redis), so a lookup sent sooner would miss. A busy CI
    // machine once got there first.
    eventually([&] { return counter("connected") == 1; }, "L2 connected");
    int fd = -1;
    REQUIRE(c.hello(&fd)->status == Status::ok);
    arena.emplace(fd, 16u << 20);
    auto r = must_call(c, RegisterLayout{layout()});
    REQUIRE(r.status == Status::ok);
    reg = std::get<RegisterReply>(r.payload).registration;
  }
  static std::vector<std::string> flags(const std::string& url, std::uint16_t port, std::vector<std::string> extra) {
    std::vector<std::string> f = kFlags;
    for (const std::string& a : {std::string("--l2"), url, std::string("--http"), "127.0.0.1:" + std::to_string(port)})
      f.push_back(a);
    if (std::find(extra.begin(), extra.end(), "--l2-timeout") == extra.end())
      for (const std::string& a : {std::string("--l2-timeout"), std::to_string(kL2Timeout.count())}) f.push_back(a);
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  }

  // Stores `ks`, object i filled from `seed` and i; returns the bytes written.
  std::vector<std::vector<std::byte>> store(const std::vector<kv::ChunkKey>& ks, int seed) {
    ReserveReply r = reserve(c, reg, ks);
    std::vector<std::vector<std::byte>> wrote;
    for (std::size_t i = 0; i < ks.size(); ++i) {
      REQUIRE(r.chunks[i] == ChunkState::reserved);
      std::vector<std::byte> o(kObject);
      for (std::size_t b = 0; b < o.size(); ++b) o[b] = static_cast<std::byte>((seed * 131 + i * 17 + b * 7) & 0xff);
      std::memcpy(arena->p + r.offsets[i], o.data(), o.size());
      wrote.push_back(std::move(o));
    }
    REQUIRE(must_call(c, Commit{r.reservation, true}).status == Status::ok);
    return wrote;
  }
  // The hit of `ks`, its bytes checked against `want` (one per chunk of the
  // hit); the lease released.
  std::uint32_t load(const std::vector<kv::ChunkKey>& ks, const std::vector<std::vector<std::byte>>& want) {
    LookupReply l = lookup(c, reg, ks);
    const std::uint32_t chunks = l.hit.tokens / 64;
    for (std::uint32_t i = 0; i < chunks; ++i) {
      INFO("chunk " << i);
      REQUIRE(std::memcmp(arena->p + l.offsets[i], want[i].data(), kObject) == 0);
    }
    if (l.lease != 0) REQUIRE(must_call(c, Release{l.lease}).status == Status::ok);
    return chunks;
  }
  // A counter of /metrics (kvstrand_server_l2_NAME_total).
  double counter(const std::string& name) {
    const std::string body = curl(port, "/metrics").body;
    const std::string line = "\nkvstrand_server_l2_" + name + " ";  // the sample, not its # HELP
    const auto at = body.find(line);
    if (at == std::string::npos) return -1;
    return std::stod(body.substr(at + line.size()));
  }

  std::uint16_t port;
  ServerProcess srv;
  bool ready;
  Client c;
  std::optional<Mapped> arena;
  std::uint32_t reg = 0;
};

// Markers on a master (kvstrand:v1:ns:NS, one per namespace written).
inline std::size_t redis_markers(RedisNodes& redis, int i) {
  return std::stoul(redis.cli(i, {"EVAL", "return #redis.call('KEYS', ARGV[1])", "0", "kvstrand:v1:ns:*"}));
}

// Values in Redis over every master (not the namespaces' markers).
inline std::size_t redis_keys(RedisNodes& redis) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < redis.size(); ++i)
    n += std::stoul(redis.cli(static_cast<int>(i), {"DBSIZE"})) - redis_markers(redis, static_cast<int>(i));
  return n;
}

// SCAN commands a master has run (INFO commandstats).
inline std::size_t scans_run(RedisNodes& redis, int i) {
  const std::string info = redis.cli(i, {"INFO", "commandstats"});
  const auto at = info.find("cmdstat_scan:calls=");
  return at == std::string::npos ? 0 : std::stoul(info.substr(at + 19));
}

// `n` one-chunk prompts stored through `a` and written behind to L2.
inline std::map<int, std::vector<std::byte>> store_prompts(Node& a, RedisNodes& redis, int n) {
  std::map<int, std::vector<std::byte>> out;
  for (int p = 1; p <= n; ++p) out[p] = a.store(keys(p, 1), p).front();
  eventually([&] { return redis_keys(redis) == static_cast<std::size_t>(n); }, "every prompt written behind");
  return out;
}

// The index of the master holding prompt p's chunk.
inline int master_of(RedisTestClient& rc, RedisNodes& redis, int p) {
  return redis.index_of(rc.node_of(l2::redis_key_of(keys(p, 1)[0])));
}

// Two nodes on a 3-master cluster; `n` one-chunk prompts stored through A
// and written behind.
struct TwoNodes {
  explicit TwoNodes(int n) {
    REQUIRE_FALSE(rc.start());
    prompts = store_prompts(a, redis, n);
  }
  // Every prompt looked up through B with master `down` gone or stopped:
  // each lookup ends within the timeout, those on `down` miss, every other
  // one loads exactly. How many missed.
  int load_all_with_master_down(int down) {
    int hits = 0, misses = 0;
    for (const auto& [p, bytes] : prompts) {
      INFO("prompt " << p);
      const auto t0 = std::chrono::steady_clock::now();
      const std::uint32_t got = b.load(keys(p, 1), {bytes});
      REQUIRE(std::chrono::steady_clock::now() - t0 < kL2Timeout + 2s);  // bounded, with room for a loaded machine
      REQUIRE(got == (master_of(rc, redis, p) == down ? 0u : 1u));
      (got ? hits : misses) += 1;
    }
    REQUIRE(hits > 10);
    return misses;
  }
  RedisNodes redis{3, true};
  Node a{redis.url()}, b{redis.url()};
  RedisTestClient rc{redis.url()};
  std::map<int, std::vector<std::byte>> prompts;
};

}  // namespace kvstrand::test
