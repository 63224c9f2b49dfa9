// kvstrand-server's tenants as real processes: --max-tenants with a scrape
// beside it, and tenants bound to the users their processes run as (clients
// forked as other uids: they need this test to run as root).
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <boost/json.hpp>
#include <catch2/catch.hpp>

#include "curl.hpp"
#include "protocol_session.hpp"
#include "support.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace kvstrand::proto;
using namespace std::chrono_literals;

TEST_CASE("server: tenants past --max-tenants are refused, and /metrics and /debug/tier still answer at once",
          "[server][http][tenants]") {
  if (!curl_present()) return;
  // 65,535 self-named tenants wrapped the 16-bit counter that /metrics and
  // /debug/tier counted tenants with: the scrape never finished, on the
  // strand, and no client was served again.
  const auto port = free_port();
  ServerProcess srv({"--tier-bytes", "16M", "--slab-bytes", "4M", "--chunk-tokens", "64", "--max-tenants", "40",
                     "--tenant-quota", "late=1M", "--http", "127.0.0.1:" + std::to_string(port)});
  REQUIRE(srv.ready());
  Client c(srv.socket_path());
  REQUIRE(must_call(c, Hello{kMajor, kMinor, "tenants", {}}).status == Status::ok);
  int served = 0, refused = 0;
  for (int t = 0; t < 100; ++t) {
    kv::Layout l = layout();
    l.tenant = "t" + std::to_string(t);
    const Reply r = must_call(c, RegisterLayout{l});
    if (r.status == Status::ok) ++served;
    if (r.status == Status::bad_request && r.message.find("--max-tenants") != std::string::npos) ++refused;
  }
  REQUIRE(served == 38);  // 40 less the unnamed one and "late"
  REQUIRE(refused == 62);
  kv::Layout late = layout();
  late.tenant = "late";  // configured: its id kept for it
  REQUIRE(must_call(c, RegisterLayout{late}).status == Status::ok);
  const Got metrics = curl(port, "/metrics");
  REQUIRE(metrics.code == 200);
  REQUIRE(metrics.body.find("tenant=\"late\"") != std::string::npos);
  const auto tier = boost::json::parse(curl(port, "/debug/tier").body);
  REQUIRE(tier.at("tenants").as_array().size() == 40);
  REQUIRE(must_call(c, Stats{}).status == Status::ok);  // and the strand still serves
}

namespace {
constexpr gid_t kEnginesGroup = 61000;  // --socket-group: the tenants' processes are in it

// Runs `body` in a forked child as user `uid` (group kEnginesGroup), for
// its exit code (99: it could not become that user).
template <class Body>
int as_user(uid_t uid, Body body) {
  const pid_t child = ::fork();
  if (child == 0) {
    const gid_t g = kEnginesGroup;
    if (::setgroups(1, &g) != 0 || ::setgid(g) != 0 || ::setuid(uid) != 0) ::_exit(99);
    int code = 98;
    try {
      code = body();
    } catch (...) {
    }
    ::_exit(code);
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

kv::Layout tenant_layout(const std::string& tenant) {
  kv::Layout l = layout();
  l.tenant = tenant;
  return l;
}
std::vector<kv::ChunkKey> tenant_keys(const std::string& tenant, std::uint32_t n) {
  const kv::Layout l = tenant_layout(tenant);
  return kv::chunk_keys(l, kv::namespace_of(l), std::vector<std::uint32_t>(n * 64, 5));
}

// A server's flags: team-a and team-b bound to users 61001 and 61002 (the
// clients forked as them), then `more`.
std::vector<std::string> two_tenants(const std::vector<std::string>& more = {}) {
  std::vector<std::string> f{"--tier-bytes", "16M", "--slab-bytes", "4M", "--chunk-tokens", "64",
                             "--tenant-uid", "team-a=61001", "--tenant-uid", "team-b=61002",
                             "--socket-group", std::to_string(kEnginesGroup)};
  f.insert(f.end(), more.begin(), more.end());
  return f;
}

// Clients of other users need the test to run as root: says so when not.
bool as_root() {
  if (::geteuid() == 0) return true;
  WARN("skipped: clients of other users need this test to run as root");
  return false;
}
}  // namespace

TEST_CASE("server: a tenant is what the kernel says a client's user is: it registers, reads and drops as that "
          "tenant only, and an unmapped user is refused",
          "[server][tenants][trust]") {
  if (!as_root()) return;
  ServerProcess srv(two_tenants());
  REQUIRE(srv.ready());
  struct stat st {};
  REQUIRE(::stat(srv.socket_path().c_str(), &st) == 0);
  REQUIRE((st.st_mode & 0777) == 0660);
  REQUIRE(st.st_gid == kEnginesGroup);

  // team-a's process stores two chunks, as team-a only.
  REQUIRE(as_user(61001, [&] {
            Client a(srv.socket_path());
            if (a.call_or_throw(Hello{kMajor, kMinor, "a", {}}).status != Status::ok) return 10;
            if (a.call_or_throw(RegisterLayout{tenant_layout("team-b")}).status != Status::not_authorized) return 11;
            const Reply reg = a.call_or_throw(RegisterLayout{tenant_layout("team-a")});
            if (reg.status != Status::ok) return 12;
            const auto r = std::get<RegisterReply>(reg.payload).registration;
            const Reply res = a.call_or_throw(Reserve{r, tenant_keys("team-a", 2), {0, 0}});
            if (res.status != Status::ok) return 13;
            if (a.call_or_throw(Commit{std::get<ReserveReply>(res.payload).reservation, true}).status != Status::ok) return 14;
            return 0;
          }) == 0);
  // team-b's process: a's chunks are a miss to it, not its to write, drop
  // or drop the tenant of; its own tenant it may drop.
  REQUIRE(as_user(61002, [&] {
            Client b(srv.socket_path());
            if (b.call_or_throw(Hello{kMajor, kMinor, "b", {}}).status != Status::ok) return 20;
            const Reply reg = b.call_or_throw(RegisterLayout{tenant_layout("team-b")});
            if (reg.status != Status::ok) return 21;
            const auto r = std::get<RegisterReply>(reg.payload).registration;
            const auto theirs = tenant_keys("team-a", 2);
            const Reply hit = b.call_or_throw(Lookup{r, theirs});
            if (hit.status != Status::ok || std::get<LookupReply>(hit.payload).hit.tokens != 0) return 22;
            if (b.call_or_throw(Reserve{r, theirs, {0, 0}}).status != Status::bad_request) return 23;
            if (b.call_or_throw(Drop{theirs[0].ns}).status != Status::not_authorized) return 24;
            if (b.call_or_throw(DropTenant{"team-a"}).status != Status::not_authorized) return 25;
            if (b.call_or_throw(DropTenant{"team-b"}).status != Status::ok) return 26;
            return 0;
          }) == 0);
  // A user the map does not name is refused at connect, told which options would let it in.
  REQUIRE(as_user(61003, [&] {
            // The refusal comes on accept, and the connection closes: read
            // it without sending (bytes the server never read would reset
            // the connection, and the refusal with it).
            Client c(srv.socket_path());
            std::array<std::byte, kHeaderBytes> head{};
            int fd = -1;
            if (channel::recv_with_fd(c.fd(), head.data(), 1, &fd, 0) != 1) return 33;
            if (!c.read_exact(head.data() + 1, head.size() - 1)) return 34;
            Header h;
            if (decode_header(head, kDefaultMaxBody, &h) != HeaderError::none) return 35;
            std::vector<std::byte> body(h.body_bytes);
            if (!c.read_exact(body.data(), body.size())) return 36;
            const auto r = decode_reply(h.type, body);
            if (!r || r->status != Status::not_authorized) return 30;
            if (r->message.find("--tenant-uid") == std::string::npos) return 31;
            return fd < 0 ? 0 : 32;  // and no arena
          }) == 0);
  // The server's user (root here) is an admin: a's chunks are all there, and it may drop them.
  Client admin(srv.socket_path());
  REQUIRE(must_call(admin, Hello{kMajor, kMinor, "admin", {}}).status == Status::ok);
  const Reply reg = must_call(admin, RegisterLayout{tenant_layout("team-a")});
  const auto r = std::get<RegisterReply>(reg.payload).registration;
  const LookupReply there = lookup(admin, r, tenant_keys("team-a", 2));
  REQUIRE(there.hit.tokens == 2 * 64);
  REQUIRE(must_call(admin, Release{there.lease}).status == Status::ok);
  REQUIRE(std::get<DropReply>(must_call(admin, DropTenant{"team-a"}).payload).arena_objects == 2);
}

TEST_CASE("server: a refused user is logged once, not at every retry", "[server][trust]") {
  if (!as_root()) return;
  const std::string path = ServerProcess::fresh_socket_path();
  ChildProcess srv({sibling_binary("../kvstrand-server"), "--socket", path, "--tier-bytes", "16M", "--slab-bytes", "4M",
                    "--chunk-tokens", "64", "--tenant-uid", "team-a=61001", "--socket-group",
                    std::to_string(kEnginesGroup), "--log-level", "info"});
  REQUIRE(srv.wait_for_output("listening on", 30s));
  for (int attempt = 0; attempt < 5; ++attempt)
    REQUIRE(as_user(61003, [&] {
              // The refusal's frame, then the server hangs up (EOF).
              Client c(path);
              for (int bytes = 0; bytes < 1024; ++bytes)
                if (c.closed_by_server(2000)) return 0;
              return 2;
            }) == 0);
  srv.signal(SIGTERM);
  const auto out = srv.wait().output;
  std::size_t said = 0;
  for (std::size_t at = out.find("refused a connection"); at != std::string::npos;
       at = out.find("refused a connection", at + 1))
    ++said;
  INFO(out);
  REQUIRE(said == 1);
  ::unlink(path.c_str());
}

namespace {
// What a tenant's process sees of the memory it is handed at hello: its
// size, and the tier's bytes there through a mapping of its own.
struct Handed {
  Client c;
  std::uint64_t bytes = 0;
  std::byte* p = nullptr;
  explicit Handed(const std::string& socket) : c(socket) {
    int fd = -1;
    auto h = c.hello(&fd);
    if (!h || h->status != Status::ok || fd < 0) throw std::runtime_error("no hello");
    bytes = std::get<HelloReply>(h->payload).arena_bytes;
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) throw std::runtime_error("no mapping");
    p = static_cast<std::byte*>(m);
  }
  ~Handed() { ::munmap(p, bytes); }
  std::uint32_t reg(const std::string& tenant) {
    const Reply r = c.call_or_throw(RegisterLayout{tenant_layout(tenant)});
    if (r.status != Status::ok) throw std::runtime_error(r.message);
    return std::get<RegisterReply>(r.payload).registration;
  }
};

// team-a's process stores `ks` as chunks of 0x5A in the memory it is
// handed, `handed` bytes: 0, or the step that failed.
int team_a_stores(const std::string& socket, const std::vector<kv::ChunkKey>& ks, std::uint64_t handed) {
  const std::uint64_t object = tenant_layout("team-a").object_bytes(true);
  return as_user(61001, [&] {
    Handed a(socket);
    if (a.bytes != handed) return 10;
    const Reply res = a.c.call_or_throw(Reserve{a.reg("team-a"), ks, std::vector<std::uint8_t>(ks.size(), 1)});
    if (res.status != Status::ok) return 11;
    const auto& rr = std::get<ReserveReply>(res.payload);
    for (std::uint64_t off : rr.offsets) {
      if (off + object > a.bytes) return 12;  // an offset within what it was handed
      std::memset(a.p + off, 0x5A, object);
    }
    return a.c.call_or_throw(Commit{rr.reservation, true}).status == Status::ok ? 0 : 13;
  });
}

// team-a stores two chunks of 0x5A; team-b's process then writes 0xEE over
// all the memory it was handed; whether team-a's chunks are still whole.
bool survives_another_tenant(const std::vector<std::string>& segment) {
  ServerProcess srv(two_tenants(segment));
  REQUIRE(srv.ready());
  REQUIRE(Client(srv.socket_path()).wait_full());
  const auto ks = tenant_keys("team-a", 2);
  const std::uint64_t object = tenant_layout("team-a").object_bytes(true);
  // Its segment's size, or the arena's.
  REQUIRE(team_a_stores(srv.socket_path(), ks, segment.empty() ? 16u << 20 : 8u << 20) == 0);
  REQUIRE(as_user(61002, [&] {
            Handed b(srv.socket_path());
            std::memset(b.p, 0xEE, b.bytes);
            return 0;
          }) == 0);
  const int intact = as_user(61001, [&] {
    Handed a(srv.socket_path());
    const Reply hit = a.c.call_or_throw(Lookup{a.reg("team-a"), ks});
    if (hit.status != Status::ok) return 20;
    const auto& lr = std::get<LookupReply>(hit.payload);
    if (lr.offsets.size() != 2) return 21;
    for (std::uint64_t off : lr.offsets)
      for (std::uint64_t i = 0; i < object; ++i)
        if (a.p[off + i] != std::byte{0x5A}) return 1;
    return 0;
  });
  REQUIRE((intact == 0 || intact == 1));
  return intact == 0;
}
}  // namespace

TEST_CASE("server: a tenant's segment is memory no other tenant's process is handed: another writing all it can "
          "reach leaves its objects whole",
          "[server][tenants][trust]") {
  if (!as_root()) return;
  // One arena for all: team-b's process can overwrite team-a's objects
  // (what docs/server.md says of tenants without segments).
  CHECK_FALSE(survives_another_tenant({}));
  // team-a's own segment: team-b was handed the arena, which holds none of them.
  CHECK(survives_another_tenant({"--tenant-segment", "team-a=8M"}));
}

TEST_CASE("server: with tenants bound to users, the events' ipc:// sockets are the engines' group's (the server "
          "user's alone without one) and an open /debug/tier lists no namespace",
          "[server][tenants][trust][events]") {
  if (::geteuid() != 0 || !curl_present()) {
    WARN("skipped: needs root (a group of its choosing) and curl");
    return;
  }
  const auto mode_of = [](const std::string& path) {
    struct stat st {};
    REQUIRE(::lstat(path.c_str(), &st) == 0);
    return std::pair{st.st_mode & 0777, st.st_gid};
  };
  const std::string base = ServerProcess::fresh_socket_path();
  const auto port = free_port();
  {
    ServerProcess srv({"--tier-bytes", "16M", "--slab-bytes", "4M", "--chunk-tokens", "64", "--tenant-uid",
                       "team-a=61001", "--socket-group", std::to_string(kEnginesGroup), "--events",
                       "ipc://" + base + ".ev", "--events-replay", "ipc://" + base + ".rp", "--http",
                       "127.0.0.1:" + std::to_string(port)});
    REQUIRE(srv.ready());
    REQUIRE(mode_of(base + ".ev") == std::pair{0660u, kEnginesGroup});
    REQUIRE(mode_of(base + ".rp") == std::pair{0660u, kEnginesGroup});
    // Root (an admin) stores a chunk of team-a's: its namespace is not listed.
    Client admin(srv.socket_path());
    REQUIRE(must_call(admin, Hello{kMajor, kMinor, "admin", {}}).status == Status::ok);
    const auto r = std::get<RegisterReply>(must_call(admin, RegisterLayout{tenant_layout("team-a")}).payload);
    const Reply res = must_call(admin, Reserve{r.registration, tenant_keys("team-a", 1), {0}});
    REQUIRE(must_call(admin, Commit{std::get<ReserveReply>(res.payload).reservation, true}).status == Status::ok);
    const auto tier = boost::json::parse(curl(port, "/debug/tier").body).as_object();
    REQUIRE(tier.at("objects").as_int64() == 1);
    REQUIRE(tier.at("namespaces").as_array().empty());
    REQUIRE(tier.contains("namespaces_hidden"));
  }
  ServerProcess alone({"--tier-bytes", "16M", "--slab-bytes", "4M", "--chunk-tokens", "64", "--events",
                       "ipc://" + base + ".ev2"});
  REQUIRE(alone.ready());
  REQUIRE(mode_of(base + ".ev2").first == 0600u);
  for (const char* end : {".ev", ".rp", ".ev2"}) ::unlink((base + end).c_str());
}

TEST_CASE("server: a published tenant's objects are read by another tenant's process through memory it cannot "
          "make writable, and that session stores, drops and registers nothing else",
          "[server][tenants][trust]") {
  if (!as_root()) return;
  ServerProcess srv(two_tenants({"--tenant-segment", "team-a=8M", "--public-tenant", "team-a"}));
  REQUIRE(srv.ready());
  REQUIRE(Client(srv.socket_path()).wait_full());
  const auto ks = tenant_keys("team-a", 2);
  const std::uint64_t object = tenant_layout("team-a").object_bytes(true);
  REQUIRE(team_a_stores(srv.socket_path(), ks, 8u << 20) == 0);
  // Each step's own exit code: which one failed shows in the REQUIRE.
  const int read = as_user(61002, [&]() -> int {
    Client b(srv.socket_path());
    int fd = -1;
    auto h = b.hello(&fd, "team-a");
    if (!h || h->status != Status::ok || fd < 0) return 1;
    const std::uint64_t bytes = std::get<HelloReply>(h->payload).arena_bytes;
    if (bytes != 8u << 20) return 2;  // team-a's segment, not the arena
    // Nothing makes the memory writable: not a mapping, not mprotect, not
    // the descriptor opened again through /proc.
    if (::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) != MAP_FAILED) return 3;
    void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return 4;
    if (::mprotect(m, bytes, PROT_READ | PROT_WRITE) == 0) return 5;
    if (::open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDWR) >= 0) return 6;
    const auto* p = static_cast<const std::byte*>(m);
    const Reply r = b.call_or_throw(RegisterLayout{tenant_layout("team-a")});
    if (r.status != Status::ok) return 7;
    const std::uint32_t reg = std::get<RegisterReply>(r.payload).registration;
    const Reply hit = b.call_or_throw(Lookup{reg, ks});
    if (hit.status != Status::ok || std::get<LookupReply>(hit.payload).offsets.size() != 2) return 8;
    for (std::uint64_t off : std::get<LookupReply>(hit.payload).offsets)
      for (std::uint64_t i = 0; i < object; ++i)
        if (p[off + i] != std::byte{0x5A}) return 9;
    // A reader stores nothing, drops nothing, and registers only the tenant it reads.
    if (b.call_or_throw(Reserve{reg, tenant_keys("team-a", 3), {0, 0, 0}}).status != Status::not_authorized) return 10;
    if (b.call_or_throw(Drop{kv::namespace_of(tenant_layout("team-a"))}).status != Status::not_authorized) return 11;
    if (b.call_or_throw(RegisterLayout{tenant_layout("team-b")}).status != Status::not_authorized) return 12;
    // team-b publishes nothing: no session reads it.
    Client c(srv.socket_path());
    int other = -1;
    auto refused = c.hello(&other, "team-b");
    if (other >= 0) ::close(other);
    return refused && refused->status == Status::not_authorized ? 0 : 13;
  });
  REQUIRE(read == 0);
}
