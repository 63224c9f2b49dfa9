// The L2 paths of kvstrand-server against the best a plain Redis client
// does with the same bytes, measured in the same run on the same Redis:
//
// - write-behind: L2Tier takes committed objects out of an arena (header,
//   checksum, pipelined SET batches of 16) until every one is written;
//   baseline: pipelined SET batches of 16 values of the same size.
// - promotion: L2Tier::promote of a prompt's chunks (one pipelined GET,
//   header and checksum checked, copied into an empty arena), prompt after
//   prompt; baseline: pipelined GET of the same keys, prompt after prompt.
//
// Objects are one chunk of the reference geometry (16 blocks of 739,840 B
// and a 1 MiB image: 12.9 MB). Redis: one redis-server this program starts
// (no persistence, loopback) unless --l2 names one (a cluster works too).
// Each figure is the best of --reps runs. --mac: kvstrand's values carry a
// MAC (under a fixed key, as --l2-mac-key-file gives the
// server): computed on write-behind, checked on promotion; the baselines
// are the same plain SETs and GETs.
//
// usage: bench_l2 [--l2 redis://HOST:PORT[,...]] [--chunks N] [--prompt-chunks K] [--reps R]
//                 [--redis-binary PATH] [--mac]
// The last lines: "l2 write-behind ... ratio R" and "l2 promotion ... ratio R (target >= 0.8)".
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/free_port.hpp"
#include "l2/chunk_value.hpp"
#include "l2/redis_cluster.hpp"
#include "reference_geometry.hpp"
#include "server/levels/l2_tier.hpp"
#include "tier/arena.hpp"
#include "tier/index.hpp"

extern char** environ;

using namespace kvstrand;
using namespace kvstrand::bench;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

// A redis-server on a free loopback port; SIGTERM and reaped at the end.
struct OwnRedis {
  int port = 0;
  pid_t pid = -1;
  explicit OwnRedis(const std::string& binary) {
    port = common::free_port();
    if (port == 0) die("no free port for redis-server");
    std::vector<std::string> args = {binary, "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "",
                                     "--appendonly", "no", "--logfile", "/dev/null"};
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    if (::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) die("cannot start " + binary);
  }
  ~OwnRedis() {
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port); }
};

// An arena of `n` objects in host memory, one "slab", and its index.
// One slab holding every object, one size class: the server's arrangement.
struct HostArena {
  HostArena(std::uint32_t n, std::uint64_t object)
      : bytes(n * object), mem(bytes), classes(bytes), index(*classes.index(object)) {
    classes.add_slab(0);
    classes.make_room(index, n);
  }
  std::uint64_t bytes;
  std::vector<std::byte> mem;
  tier::SizeClasses classes;
  tier::Index& index;
};

std::vector<std::byte> object_bytes(std::uint64_t n, std::uint64_t seed) {
  std::vector<std::byte> o(n);
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::uint64_t i = 0; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(o.data() + i, &x, 8);
  }
  return o;
}

double gbps(std::uint64_t bytes, Clock::duration d) {
  return static_cast<double>(bytes) / 1e9 / std::chrono::duration<double>(d).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string url, redis_binary = "/usr/bin/redis-server";
  std::uint32_t chunks = 32, prompt_chunks = 8, reps = 3;
  bool mac = false;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--mac") {
      mac = true;
      continue;
    }
    if (i + 1 >= argc) die(f + " needs a value");
    const std::string v = argv[++i];
    if (f == "--l2") url = v;
    else if (f == "--chunks") chunks = static_cast<std::uint32_t>(std::stoul(v));
    else if (f == "--prompt-chunks") prompt_chunks = static_cast<std::uint32_t>(std::stoul(v));
    else if (f == "--reps") reps = static_cast<std::uint32_t>(std::stoul(v));
    else if (f == "--redis-binary") redis_binary = v;
    else die("unknown flag " + f);
  }
  if (chunks == 0 || prompt_chunks == 0 || chunks % prompt_chunks != 0 || reps == 0)
    die("--chunks must be a positive multiple of --prompt-chunks, --reps > 0");
  std::optional<OwnRedis> own;
  if (url.empty()) {
    own.emplace(redis_binary);
    url = own->url();
    std::this_thread::sleep_for(300ms);  // listening
  }
  auto seeds = l2::parse_redis_url(url);
  if (!seeds) die("--l2: " + seeds.why());

  const kv::Layout layout = reference_layout();
  const std::uint64_t object = layout.object_bytes(true);
  std::vector<kv::ChunkKey> keys;
  for (std::uint32_t p = 0; keys.size() < chunks; ++p)
    for (const kv::ChunkKey& k : prompt_keys(layout, 1000 + p)) keys.push_back(k);
  keys.resize(chunks);
  std::vector<std::vector<std::byte>> objects;
  for (std::uint32_t i = 0; i < chunks; ++i) objects.push_back(object_bytes(object, i + 1));
  std::printf("bench_l2: %u objects of %.1f MB (one reference chunk each), prompts of %u chunks, %s, best of %u, "
              "values %s\n",
              chunks, static_cast<double>(object) / 1e6, prompt_chunks, url.c_str(), reps,
              mac ? "MACed (GMAC, a key per value)" : "checksummed (XXH3)");

  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  common::Strand strand = asio::make_strand(io);
  std::thread loop([&] { io.run(); });
  auto on_strand = [&](auto make) { return asio::co_spawn(strand, make(), asio::use_future).get(); };

  server::L2Options opt;
  opt.seeds = *seeds;
  opt.timeout = 30s;  // a throughput run: nothing may time out
  opt.max_inflight = chunks;
  if (mac) opt.mac = l2::MacKey{"bench_l2: a fixed key of 32 bytes or more"};
  l2::RedisOptions ropt;
  ropt.seeds = *seeds;
  ropt.timeout = 30s;
  ropt.max_inflight = 4 * chunks;

  HostArena source(chunks, object);
  std::vector<std::uint32_t> slots(chunks);
  for (std::uint32_t i = 0; i < chunks; ++i) {
    if (source.index.reserve(keys[i], true, &slots[i]) != tier::Index::Reserve::reserved) die("source arena full");
    source.index.commit(keys[i]);
    std::memcpy(source.mem.data() + source.classes.offset_of(source.index, slots[i]), objects[i].data(), object);
  }

  std::optional<server::L2Tier> l2;
  std::optional<l2::RedisCluster> plain;
  on_strand([&]() -> asio::awaitable<void> {
    l2.emplace(strand, opt, source.mem.data(), source.classes);
    l2->start();
    plain.emplace(strand, ropt);
    if (co_await plain->start()) die("no Redis node answers at " + url);
  });
  while (!on_strand([&]() -> asio::awaitable<bool> { co_return l2->stats().connected; }))
    std::this_thread::sleep_for(10ms);

  double wb = 0, set = 0, promo = 0, get = 0;
  for (std::uint32_t rep = 0; rep < reps; ++rep) {
    // Write-behind: every object committed at once, until all are written.
    const std::uint64_t before = on_strand([&]() -> asio::awaitable<std::uint64_t> {
      co_return l2->stats().written + l2->stats().write_failed;
    });
    const auto t0 = Clock::now();
    on_strand([&]() -> asio::awaitable<void> {
      l2->committed(source.index, slots);
      co_return;
    });
    for (;;) {
      const auto st = on_strand([&]() -> asio::awaitable<server::L2Stats> { co_return l2->stats(); });
      if (st.write_failed != 0) die("a write-behind SET failed");
      if (st.written + st.write_failed - before == chunks) break;
      std::this_thread::sleep_for(200us);
    }
    wb = std::max(wb, gbps(chunks * object, Clock::now() - t0));

    // Pipelined SETs of 16 values of the same size, plain keys.
    const auto t1 = Clock::now();
    for (std::uint32_t i = 0; i < chunks; i += 16) {
      std::vector<std::pair<std::string, std::string>> items;
      for (std::uint32_t k = i; k < std::min(chunks, i + 16); ++k)
        items.emplace_back("bench_l2:plain:" + std::to_string(k),
                           std::string(reinterpret_cast<const char*>(objects[k].data()), object));
      auto r = on_strand([&]() -> asio::awaitable<std::vector<l2::RedisResult>> {
        co_return co_await plain->set(std::move(items), 0s);
      });
      for (const auto& x : r)
        if (!x.answered()) die("a plain SET failed: " + x.why);
    }
    set = std::max(set, gbps(chunks * object, Clock::now() - t1));

    // Promotion into an empty arena, prompt after prompt.
    HostArena fresh(chunks, object);
    std::optional<server::L2Tier> into;
    on_strand([&]() -> asio::awaitable<void> {
      into.emplace(strand, opt, fresh.mem.data(), fresh.classes);
      into->start();
      co_return;
    });
    while (!on_strand([&]() -> asio::awaitable<bool> { co_return into->stats().connected; }))
      std::this_thread::sleep_for(10ms);
    const auto t2 = Clock::now();
    for (std::uint32_t i = 0; i < chunks; i += prompt_chunks) {
      std::vector<kv::ChunkKey> prompt(keys.begin() + i, keys.begin() + i + prompt_chunks);
      const std::size_t got = on_strand([&]() -> asio::awaitable<std::size_t> {
        co_return (co_await into->promote(fresh.index, std::move(prompt), tier::TenantId{0})).have;
      });
      if (got != prompt_chunks) die("a promotion found " + std::to_string(got) + " of " + std::to_string(prompt_chunks));
    }
    promo = std::max(promo, gbps(chunks * object, Clock::now() - t2));
    // Every promoted object is the one written.
    for (std::uint32_t i = 0; i < chunks; ++i) {
      auto pinned = fresh.index.read_lock(std::span<const kv::ChunkKey>(&keys[i], 1));
      if (!pinned) die("a promoted object is missing");
      if (std::memcmp(fresh.mem.data() + fresh.classes.offset_of(fresh.index, pinned->front()),
                      objects[i].data(), object) != 0)
        die("a promoted object differs from the one written");
    }
    on_strand([&]() -> asio::awaitable<void> {
      into.reset();
      co_return;
    });

    // Pipelined GETs of the same keys, prompt after prompt.
    const auto t3 = Clock::now();
    for (std::uint32_t i = 0; i < chunks; i += prompt_chunks) {
      std::vector<std::string> names;
      for (std::uint32_t k = i; k < i + prompt_chunks; ++k) names.push_back(l2::redis_key_of(keys[k]));
      auto r = on_strand([&]() -> asio::awaitable<std::vector<l2::RedisResult>> {
        co_return co_await plain->get(std::move(names));
      });
      for (const auto& x : r)
        if (!x.answered() || x.value.kind != l2::RedisValue::Kind::string) die("a plain GET failed: " + x.why);
    }
    get = std::max(get, gbps(chunks * object, Clock::now() - t3));
    std::printf("  run %u: write-behind %.2f GB/s, SET %.2f, promotion %.2f, GET %.2f\n", rep + 1, wb, set, promo, get);
  }
  on_strand([&]() -> asio::awaitable<void> {
    l2.reset();
    plain.reset();
    co_return;
  });
  guard.reset();
  io.stop();
  loop.join();
  const char* with = mac ? " (MACed)" : "";
  std::printf("l2 write-behind%s %.2f GB/s, pipelined SET %.2f GB/s: ratio %.2f\n", with, wb, set, wb / set);
  std::printf("l2 promotion%s %.2f GB/s, pipelined GET %.2f GB/s: ratio %.2f (target >= 0.8)\n", with, promo, get,
              promo / get);
  return 0;
}
