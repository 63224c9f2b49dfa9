// kvstrand-server with --l2 on real Redis: two servers standing for two
// nodes, each with its own arena, on one 3-master Redis Cluster. A prompt
// stored through one is loaded byte for byte through the other; altered
// values, killed, stopped and resharded masters never give a wrong byte or a
// wait past --l2-timeout; a stopped Redis never delays a reply.
#include <catch2/catch.hpp>

#include <algorithm>

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "curl.hpp"
#include "l2/chunk_value.hpp"
#include "protocol_session.hpp"
#include "redis_client.hpp"
#include "redis_nodes.hpp"
#include "l2_node.hpp"

using namespace kvstrand;
using namespace kvstrand::test;

TEST_CASE("l2: a prompt stored through node A loads through node B, whose arena never held it, byte for byte",
          "[l2][server]") {
  if (!redis_present() || !curl_present()) return;
  RedisNodes redis(3, true);
  Node a(redis.url()), b(redis.url());
  const auto ks = keys(1, 8);
  const auto wrote = a.store(ks, 1);
  eventually([&] { return a.counter("written_total") == 8; }, "A wrote 8 objects behind");
  REQUIRE(redis_keys(redis) == 8);
  REQUIRE(stats(b.srv.socket_path()).objects == 0);
  LookupReply l = lookup(b.c, b.reg, ks);
  REQUIRE(l.hit.tokens == 8 * 64);
  REQUIRE(l.hit.checkpoints == std::vector<std::uint32_t>{64, 128, 192, 256, 320, 384, 448, 512});  // the state too
  for (std::size_t i = 0; i < 8; ++i) REQUIRE(std::memcmp(b.arena->p + l.offsets[i], wrote[i].data(), kObject) == 0);
  REQUIRE(b.counter("promoted_total") == 8);
  REQUIRE(stats(b.srv.socket_path()).objects == 8);
  // A prompt that extends it: the stored part from B's arena, nothing more from L2.
  auto longer = keys(1, 10);
  REQUIRE(lookup(b.c, b.reg, longer).hit.tokens == 8 * 64);
  REQUIRE(b.counter("lookup_misses_total") == 1);
}

TEST_CASE("l2: chunks promoted from L2 are the asking registration's tenant's", "[l2][server][tenants]") {
  if (!redis_present() || !curl_present()) return;
  RedisNodes redis(3, true);
  Node a(redis.url()), b(redis.url());
  kv::Layout team = layout();
  team.tenant = "team-x";
  std::vector<std::uint32_t> toks(4 * 64, 7);
  const auto ks = kv::chunk_keys(team, kv::namespace_of(team), toks);
  const auto reg_of = [&](Node& n) {
    return std::get<RegisterReply>(must_call(n.c, RegisterLayout{team}).payload).registration;
  };
  const ReserveReply r = reserve(a.c, reg_of(a), ks);
  REQUIRE(must_call(a.c, Commit{r.reservation, true}).status == Status::ok);
  eventually([&] { return a.counter("written_total") == 4; }, "A wrote 4 objects behind");
  REQUIRE(lookup(b.c, reg_of(b), ks).hit.tokens == 4 * 64);
  REQUIRE(b.counter("promoted_total") == 4);
  // B's arena holds them as team-x's (its quota counts them), not as nobody's.
  const std::string metrics = curl(b.port, "/metrics").body;
  INFO(metrics);
  REQUIRE(metrics.find("kvstrand_server_tenant_bytes{tenant=\"team-x\",level=\"arena\"} " +
                       std::to_string(4 * kObject) + "\n") != std::string::npos);
}

TEST_CASE("l2: a value altered in Redis is a miss, counted, never loaded", "[l2][server][fault]") {
  if (!redis_present() || !curl_present()) return;
  RedisNodes redis(3, true);
  Node a(redis.url()), b(redis.url());
  RedisTestClient rc(redis.url());
  REQUIRE_FALSE(rc.start());
  const auto ks = keys(2, 4);
  const auto wrote = a.store(ks, 2);
  const auto other = keys(3, 2);
  a.store(other, 3);
  eventually([&] { return redis_keys(redis) == 6; }, "written behind");
  // One payload byte of chunk 2 changed; prompt 3's first value replaced by other bytes.
  auto r = rc.run({{"SETRANGE", l2::redis_key_of(ks[2]), std::to_string(l2::kChunkHeaderBytes + 100), "X"},
                   {"SET", l2::redis_key_of(other[0]), "not a kvstrand value"}});
  REQUIRE(r[0].answered());
  REQUIRE(r[1].answered());
  REQUIRE(b.load(ks, wrote) == 2);  // chunks 0 and 1; never chunk 2's altered bytes
  REQUIRE(b.load(other, {}) == 0);
  REQUIRE(b.counter("bad_values_total") == 2);
  // Both are deleted from Redis: not fetched and refused again on every lookup.
  eventually([&] { return b.counter("bad_values_deleted_total") == 2; }, "the refused values deleted");
  auto e = rc.run({{"EXISTS", l2::redis_key_of(ks[2])}, {"EXISTS", l2::redis_key_of(other[0])}});
  REQUIRE(e[0].value.integer == 0);
  REQUIRE(e[1].value.integer == 0);
  REQUIRE(b.load(other, {}) == 0);
  REQUIRE(b.counter("bad_values_total") == 2);
  // A Redis error reply (here WRONGTYPE: a list under a chunk's key) is an
  // error, not a corrupt value.
  const auto listed = keys(4, 1);
  REQUIRE(rc.run({{"LPUSH", l2::redis_key_of(listed[0]), "x"}})[0].answered());
  REQUIRE(b.load(listed, {}) == 0);
  REQUIRE(b.counter("error_replies_total") == 1);
  REQUIRE(b.counter("bad_values_total") == 2);
}

TEST_CASE("l2: a master SIGKILLed: lookups of what it held miss, the rest hit, none waits past --l2-timeout",
          "[l2][server][fault]") {
  if (!redis_present() || !curl_present()) return;
  TwoNodes t(45);
  t.redis.kill(0);
  REQUIRE(t.load_all_with_master_down(0) > 5);
}

TEST_CASE("l2: a master SIGSTOPped: its chunks miss within --l2-timeout, continued, they load again",
          "[l2][server][fault]") {
  if (!redis_present() || !curl_present()) return;
  TwoNodes t(30);
  t.redis.signal(1, SIGSTOP);
  const int missed = t.load_all_with_master_down(1);
  REQUIRE(missed > 3);
  REQUIRE(t.b.counter("unanswered_total") >= missed);
  t.redis.signal(1, SIGCONT);
  for (const auto& [p, bytes] : t.prompts) REQUIRE(t.b.load(keys(p, 1), {bytes}) == 1u);
}

TEST_CASE("l2: slots resharded while lookups run: every hit is exact, and all load afterwards",
          "[l2][server][fault]") {
  if (!redis_present() || !curl_present()) return;
  RedisNodes redis(3, true);
  Node a(redis.url()), b(redis.url());
  const auto prompts = store_prompts(a, redis, 60);
  // Every slot of node 0 to node 1, key by key (MIGRATE), while B looks up.
  ChildProcess reshard({"/usr/bin/redis-cli", "--cluster", "reshard", "127.0.0.1:" + std::to_string(redis.port(0)),
                        "--cluster-from", redis.node_id(0), "--cluster-to", redis.node_id(1), "--cluster-slots",
                        "16384", "--cluster-pipeline", "1", "--cluster-yes"});
  int during = 0;
  for (const auto& [p, bytes] : prompts) during += b.load(keys(p, 1), {bytes});
  const ProcessResult r = reshard.wait();
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(std::stoul(redis.cli(0, {"DBSIZE"})) == 0);  // node 0 gave everything away
  // A third node whose arena is empty: everything through L2, on the new map.
  // With time to spare: what is checked is the new map, not --l2-timeout (a
  // busy CI machine once took more than 300 ms for one of these).
  Node c(redis.url(), {"--l2-timeout", "5000"});
  for (const auto& [p, bytes] : prompts) REQUIRE(c.load(keys(p, 1), {bytes}) == 1u);
  INFO("loaded during the reshard: " << during);
  REQUIRE(c.counter("promoted_total") + during >= 60);
}

TEST_CASE("l2: with Redis stopped, replies never wait for it, a full write queue drops and counts, SIGTERM drains it",
          "[l2][server][fault]") {
  if (!redis_present() || !curl_present()) return;
  RedisNodes redis(1, false);
  Node a(redis.url(), {"--l2-max-inflight", "4"});
  eventually([&] { return a.counter("written_total") == 0; }, "metrics up");
  redis.signal(0, SIGSTOP);
  for (int p = 1; p <= 12; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    a.store(keys(p, 1), p);  // reserve and commit
    REQUIRE(std::chrono::steady_clock::now() - t0 < kL2Timeout);  // a commit does not wait for L2
  }
  // 4 queued (one batch of them in flight), the rest dropped.
  REQUIRE(a.counter("write_dropped_total") >= 7);
  redis.signal(0, SIGCONT);
  eventually([&] { return a.counter("written_total") + a.counter("write_dropped_total") +
                          a.counter("write_failed_total") >= 12; }, "the queue drained");
  // Stopped with SIGTERM while its queue waits for Redis: it writes what it
  // queued before it exits.
  const std::size_t before = redis_keys(redis);
  redis.signal(0, SIGSTOP);
  a.store(keys(20, 1), 20);
  a.store(keys(21, 1), 21);
  REQUIRE(::kill(a.srv.pid(), SIGTERM) == 0);
  std::this_thread::sleep_for(300ms);
  REQUIRE(process_state(a.srv.pid()) != 'Z');  // still draining
  redis.signal(0, SIGCONT);
  a.srv.kill(SIGTERM);  // reaped
  REQUIRE(redis_keys(redis) == before + 2);
}

TEST_CASE("l2: bad --l2 flags are refused naming the flag", "[l2][server]") {
  const std::string bin = sibling_binary("../kvstrand-server");
  for (const auto& [args, flag] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--l2", "127.0.0.1:6379"}, "--l2"},
           {{"--l2", "redis://localhost:6379"}, "--l2"},
           {{"--l2", "redis://127.0.0.1:6379", "--l2-timeout", "0"}, "--l2-timeout"},
           {{"--l2", "redis://127.0.0.1:6379", "--l2-max-inflight", "0"}, "--l2-max-inflight"},
           {{"--l2", "redis://127.0.0.1:6379", "--l2-ttl", "-1"}, "--l2-ttl"},
           {{"--l2-timeout", "100"}, "--l2-timeout"},
           {{"--l2-user", "kv"}, "--l2-user"},
           {{"--l2", "redis://127.0.0.1:6379", "--l2-user", "kv"}, "--l2-user"},
           {{"--l2", "redis://127.0.0.1:6379", "--l2-password-file", "/nonexistent/kvstrand-pw"}, "--l2-password-file"},
           {{"--l2", "redis://127.0.0.1:6379", "--l2-password-file", "/etc/hostname"}, "--l2-password-file"}}) {
    // A small tier: the default 8G may be more than a busy machine has
    // free, a refusal of its own that would hide the flag's.
    std::vector<std::string> a = {bin, "--socket", ServerProcess::fresh_socket_path()};
    a.insert(a.end(), kFlags.begin(), kFlags.end());
    a.insert(a.end(), args.begin(), args.end());
    const ProcessResult r = run_process(a, 20s);  // a flag wrongly accepted: a server that runs on, killed
    INFO(r.output);
    REQUIRE(r.exit_code == 2);
    REQUIRE(r.output.find("invalid " + flag + ":") != std::string::npos);
  }
}

TEST_CASE("l2: write-behind unpins what it wrote, and a promotion stops at the first chunk Redis lacks", "[l2][server]") {
  if (!redis_present() || !curl_present()) return;
  RedisNodes redis(1, false);
  Node a(redis.url()), b(redis.url());
  RedisTestClient rc(redis.url());
  REQUIRE_FALSE(rc.start());
  const auto ks = keys(5, 4);
  const auto wrote = a.store(ks, 5);
  eventually([&] { return a.counter("written_total") == 4; }, "A wrote 4 objects behind");
  // Its bytes taken, the writer holds nothing: every object can be evicted again.
  REQUIRE(stats(a.srv.socket_path()).pinned == 0);
  // Chunk 1 gone from Redis: chunks 2 and 3 follow a gap and are never
  // promoted under earlier keys.
  REQUIRE(rc.run({{"DEL", l2::redis_key_of(ks[1])}})[0].value.integer == 1);
  REQUIRE(b.load(ks, wrote) == 1);
  REQUIRE(b.counter("promoted_total") == 1);
  REQUIRE(stats(b.srv.socket_path()).objects == 1);
}

namespace {
// A password file of `mode` holding `password`, removed with the object.
struct PasswordFile {
  PasswordFile(const std::string& password, ::mode_t mode)
      : path(std::filesystem::temp_directory_path() /
             ("kvstrand-l2-pw-" + std::to_string(::getpid()) + "-" + std::to_string(n()++))) {
    std::ofstream(path) << password << "\n";
    ::chmod(path.c_str(), mode);
  }
  ~PasswordFile() { std::filesystem::remove(path); }
  static int& n() {
    static int i = 0;
    return i;
  }
  std::filesystem::path path;
};
}  // namespace

TEST_CASE("l2: Redis with a password and an ACL user: the right credentials store and load, wrong ones are "
          "refused once naming the options, and no password reaches the command line or the log",
          "[l2][server]") {
  if (!redis_present() || !curl_present()) return;
  const std::string admin = "adm-Xq71", secret = "kv-s3cret-Zp42", wrong = "not-the-pw-Jk93";
  RedisNodes redis(3, true, admin);
  for (int n = 0; n < 3; ++n) redis.cli(n, {"ACL", "SETUSER", "kvstrand", "on", ">" + secret, "~kvstrand:*", "+@all"});
  const PasswordFile good(secret, 0600), bad(wrong, 0600), open_file(secret, 0644);

  // Node A reads the password from a file, node B from the environment.
  Node a(redis.url(), {"--l2-user", "kvstrand", "--l2-password-file", good.path.string()});
  ::setenv("KVSTRAND_L2_PASSWORD", secret.c_str(), 1);
  Node b(redis.url(), {"--l2-user", "kvstrand"});
  ::unsetenv("KVSTRAND_L2_PASSWORD");
  const auto ks = keys(6, 4);
  const auto wrote = a.store(ks, 6);
  eventually([&] { return a.counter("written_total") == 4; }, "A wrote 4 objects behind as kvstrand");
  REQUIRE(b.load(ks, wrote) == 4);
  REQUIRE(b.counter("promoted_total") == 4);
  REQUIRE(a.counter("auth_refused") == 0);

  // Wrong password: the server serves without L2 and says so once, naming the options.
  const std::uint16_t port = free_port();
  std::vector<std::string> args = {sibling_binary("../kvstrand-server"), "--socket", ServerProcess::fresh_socket_path()};
  for (const std::string& f : Node::flags(redis.url(), port, {"--l2-user", "kvstrand", "--l2-password-file",
                                                              bad.path.string()}))
    args.push_back(f);
  ChildProcess refused(args);
  REQUIRE(refused.wait_for_output("refused the credentials", 20s));
  std::this_thread::sleep_for(1500ms);  // a retry or two: still said once
  refused.wait_for_output("never printed", 100ms);
  const std::string log = refused.output();
  INFO(log);
  REQUIRE(log.find("--l2-password-file") != std::string::npos);
  REQUIRE(log.find("WRONGPASS") != std::string::npos);
  const auto first = log.find("refused the credentials");
  REQUIRE(log.find("refused the credentials", first + 1) == std::string::npos);
  eventually([&] { return curl(port, "/metrics").body.find("kvstrand_server_l2_auth_refused 1") != std::string::npos; },
             "the refusal on /metrics");
  for (const std::string& pw : {secret, wrong, admin}) REQUIRE(log.find(pw) == std::string::npos);
  for (const std::string& pw : {secret, wrong, admin})
    for (const std::string& arg : args) REQUIRE(arg.find(pw) == std::string::npos);

  // A password file others can read is refused at start, naming it.
  std::vector<std::string> open_args = {sibling_binary("../kvstrand-server"), "--socket",
                                        ServerProcess::fresh_socket_path(), "--l2", redis.url(), "--l2-password-file",
                                        open_file.path.string()};
  open_args.insert(open_args.end(), kFlags.begin(), kFlags.end());
  const ProcessResult r = run_process(open_args, 20s);
  INFO(r.output);
  REQUIRE(r.exit_code == 2);
  REQUIRE(r.output.find("invalid --l2-password-file:") != std::string::npos);
  REQUIRE(r.output.find("chmod 600") != std::string::npos);
  REQUIRE(r.output.find(secret) == std::string::npos);
}

TEST_CASE("l2: with a MAC key, a value rewritten by a client that has the Redis password but not the key is a "
          "counted miss, never loaded, and a node without the key loads none",
          "[l2][server][fault]") {
  if (!redis_present() || !curl_present()) return;
  const std::string admin = "adm-Mc55";
  RedisNodes redis(3, true, admin);
  const PasswordFile pw(admin, 0600), key("b7c1e0d9a4f2c8e6b5a3d1f0e9c7b2a4d6f8e0c1b3a5d7f9e2c4b6a8d0f1e3c5", 0600);
  const PasswordFile short_key("tooshort", 0600), open_key("b7c1e0d9a4f2c8e6b5a3d1f0e9c7b2a4d6f8e0c1", 0644);
  const std::vector<std::string> keyed = {"--l2-password-file", pw.path.string(), "--l2-mac-key-file",
                                          key.path.string()};
  Node a(redis.url(), keyed), b(redis.url(), keyed);
  Node keyless(redis.url(), {"--l2-password-file", pw.path.string()});
  const auto ks = keys(7, 3);
  const auto wrote = a.store(ks, 7);
  eventually([&] { return a.counter("written_total") == 3; }, "A wrote 3 MACed objects behind");
  REQUIRE(b.load(ks, wrote) == 3);  // B has the key: every chunk, byte for byte
  REQUIRE(b.counter("unauthenticated_total") == 0);
  // A node without the key cannot tell these from forgeries: it loads none,
  // counts them, and leaves them in Redis for the nodes that can.
  REQUIRE(keyless.load(ks, {}) == 0);
  REQUIRE(keyless.counter("unauthenticated_total") == 1);
  REQUIRE(keyless.counter("bad_values_total") == 0);

  // The forger knows the Redis password and the format, not the key: it
  // alters chunk 1's object (both XXH3 checksums made valid again) and
  // rewrites chunk 2 as a value with no MAC at all.
  RedisTestClient rc(redis.url(), 500ms, l2::RedisOptions{}.retry_after, l2::RedisOptions{}.max_inflight,
                     l2::RedisCredentials{"", admin});
  REQUIRE_FALSE(rc.start());
  const std::string v1 = rc.run({{"GET", l2::redis_key_of(ks[1])}})[0].value.str;
  REQUIRE(v1.size() == l2::kChunkHeaderBytes + kObject);
  std::string forged = v1;
  forged[l2::kChunkHeaderBytes + 7] = static_cast<char>(forged[l2::kChunkHeaderBytes + 7] ^ 0x5a);
  auto put = [&](std::size_t at, std::uint64_t x) {
    for (int i = 0; i < 8; ++i) forged[at + i] = static_cast<char>((x >> (8 * i)) & 0xff);
  };
  put(92, XXH3_64bits(forged.data() + l2::kChunkHeaderBytes, kObject));
  put(120, XXH3_64bits(forged.data(), 120));
  std::vector<std::byte> other(kObject, std::byte{0x42});
  auto r = rc.run({{"SET", l2::redis_key_of(ks[1]), forged},
                   {"SET", l2::redis_key_of(ks[2]), l2::encode_chunk_value(ks[2], false, other)}});
  REQUIRE(r[0].answered());
  REQUIRE(r[1].answered());
  // A node whose arena never held them (C) loads chunk 0 only.
  Node c(redis.url(), keyed);
  REQUIRE(c.load(ks, wrote) == 1);
  REQUIRE(c.counter("unauthenticated_total") == 1);  // the lookup stops at chunk 1
  const auto rest = std::vector<kv::ChunkKey>{ks[2]};
  REQUIRE(c.load(rest, {}) == 0);
  REQUIRE(c.counter("unauthenticated_total") == 2);
  REQUIRE(c.counter("bad_values_total") == 0);
  REQUIRE(c.counter("promoted_total") == 1);

  // A key file others can read, or one too short, is refused at start.
  for (const PasswordFile* f : {&open_key, &short_key}) {
    std::vector<std::string> args = {sibling_binary("../kvstrand-server"), "--socket",
                                     ServerProcess::fresh_socket_path(), "--l2", redis.url(), "--l2-mac-key-file",
                                     f->path.string()};
    args.insert(args.end(), kFlags.begin(), kFlags.end());
    const ProcessResult bad = run_process(args, 20s);
    INFO(bad.output);
    REQUIRE(bad.exit_code == 2);
    REQUIRE(bad.output.find("invalid --l2-mac-key-file:") != std::string::npos);
    REQUIRE(bad.output.find(f == &open_key ? "chmod 600" : "at least 32") != std::string::npos);
  }
}

