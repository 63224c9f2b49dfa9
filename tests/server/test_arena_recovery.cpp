// kvstrand-server on a named arena (--arena-path), with real processes:
// SIGKILLed mid-store and mid-load and restarted, it serves every object it
// had committed, byte for byte, and never one it had not; the clients keep
// the mapping they pinned; an arena of another format version starts empty
// with one log line; a corrupted table entry drops its object only.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "arena_file.hpp"
#include "connector_rig.hpp"
#include "device/sim_hooks.hpp"
#include "process.hpp"
#include "server_process.hpp"
#include "support.hpp"
#include "tier/arena.hpp"
#include "tier/object_table.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using kvstrand::TransferErrc;

namespace {

std::vector<std::string> flags(const ArenaFile& a) {
  return {"--tier-bytes", "32M", "--slab-bytes", "8M", "--chunk-tokens", "64", "--arena-path", a.path};
}

connector::ConnectorOptions remote(const std::string& socket) {
  connector::ConnectorOptions o;
  o.server_socket = socket;
  o.transfer_deadline = 60s;
  o.server_request_timeout = 2s;
  return o;
}

// A server in a ChildProcess (its log read by the test), ready and full.
std::unique_ptr<ChildProcess> start_logged(const std::string& socket, const ArenaFile& a) {
  std::vector<std::string> args = {sibling_binary("../kvstrand-server"), "--socket", socket, "--log-level", "info"};
  for (const auto& f : flags(a)) args.push_back(f);
  auto p = std::make_unique<ChildProcess>(args);
  const auto end = std::chrono::steady_clock::now() + 30s;
  int fd = -1;
  while ((fd = ServerProcess::connect_to(socket)) < 0 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(10ms);
  INFO(p->output());
  REQUIRE(fd >= 0);
  ::close(fd);
  REQUIRE(Client(socket).wait_full());
  return p;
}

// How many tokens of chunks [first, last) of prompt `seed` the tier holds
// (the first request after a restart may meet the dead connection: asked
// again until the connector has reconnected, up to `tries`).
std::uint32_t hit(Rig& rig, std::uint64_t seed, std::uint32_t first, std::uint32_t last, int tries = 1) {
  std::uint32_t tokens = 0;
  for (int i = 0; i < tries; ++i) {
    rig.conn->lookup(rig.keys(seed, first, last));
    const auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); });
    tokens = f.lookups[0].hit.tokens;
    if (f.lookups[0].lease != 0) rig.conn->release_lookup(f.lookups[0].lease);
    if (tokens > 0) break;
    std::this_thread::sleep_for(100ms);
  }
  return tokens;
}

bool saved(Rig& rig, const kv::TransferSpec& spec) {
  rig.conn->save(spec);
  const auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  INFO(f.saves[0].reason);
  return f.saves[0].ok;
}

void require_loads_exact(Rig& rig, const std::string& req, std::uint64_t seed, const std::vector<kv::BlockId>& dst,
                         const std::vector<std::byte>& expect) {
  rig.randomize(99);
  rig.conn->load(rig.load_spec(req, seed, 0, 2, dst, 6));
  const auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
  INFO(f.loads[0].reason);
  REQUIRE(f.loads[0].ok);
  REQUIRE(rig.snapshot(dst, {6}) == expect);
}

void wait_pending(Rig& rig) {
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (rig.conn->transfers().empty() || rig.conn->transfers()[0].state != connector::TransferState::pending)
    REQUIRE(std::chrono::steady_clock::now() < end);
}

}  // namespace

TEST_CASE("arena recovery: a server SIGKILLed mid-store and mid-load under two clients and restarted on its named "
          "arena serves every committed object exactly, never an uncommitted one, and no client maps it again",
          "[server][reactor][fault][sim]") {
  if (!device_present() || !sim_hooks_present()) return;
  ArenaFile file;
  auto srv = std::make_unique<ServerProcess>(flags(file));
  REQUIRE(ready_and_full(*srv));
  Rig a(remote(srv->socket_path())), b(remote(srv->socket_path()));
  a.randomize(1);
  b.randomize(2);
  const auto a_src = Rig::block_range(0, 8), b_src = Rig::block_range(8, 8);
  const auto a_before = a.snapshot(a_src, {1});
  const auto b_before = b.snapshot(b_src, {1});
  REQUIRE(saved(a, a.save_spec("a1", 1, 0, 2, a_src)));
  REQUIRE(saved(b, b.save_spec("b1", 2, 0, 2, b_src)));

  // Mid-store: a's save of prompt 3 reserved, its copy queued and held.
  require_ok(device::sim::hold_stream(a.save_stream()));
  a.conn->save(a.save_spec("a2", 3, 0, 2, Rig::block_range(16, 8)));
  wait_pending(a);
  // Mid-load: b's load of prompt 2 leased, its copy queued and held.
  require_ok(device::sim::hold_stream(b.load_stream()));
  b.randomize(3);
  b.conn->load(b.load_spec("b2", 2, 0, 2, Rig::block_range(30, 8), 6));
  wait_pending(b);
  srv->kill(SIGKILL);
  srv->restart(flags(file));
  require_ok(device::sim::release_stream(a.save_stream()));
  require_ok(device::sim::release_stream(b.load_stream()));
  auto fa = a.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  REQUIRE_FALSE(fa.saves[0].ok);  // copied, never committed: not stored
  REQUIRE(fa.saves[0].error == TransferErrc::tier_unavailable);
  auto fb = b.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
  INFO(fb.loads[0].reason);
  REQUIRE(fb.loads[0].ok);  // its lease's bytes, still mapped here
  REQUIRE(b.snapshot(Rig::block_range(30, 8), {6}) == b_before);

  REQUIRE(ready_and_full(*srv));
  REQUIRE(hit(a, 1, 0, 2, 20) == 128);  // a's committed save, found again
  REQUIRE(hit(b, 2, 0, 2, 20) == 128);
  REQUIRE(hit(a, 3, 0, 2) == 0);  // the store the kill cut short is never served
  require_loads_exact(a, "a3", 1, Rig::block_range(40, 8), a_before);
  require_loads_exact(b, "b3", 2, Rig::block_range(48, 8), b_before);
  // Each client mapped and pinned the arena once, and kept it at the restart.
  for (Rig* r : {&a, &b}) {
    const auto m = r->conn->arena_mappings();
    REQUIRE(m.mapped == 1);
    REQUIRE(m.kept == 1);
  }
  // The new server holds nothing for the old one's holds, and the two
  // objects of each committed save.
  Client c(srv->socket_path());
  int fd = -1;
  REQUIRE(c.hello(&fd));
  ::close(fd);
  const auto st = c.call(proto::Stats{});
  REQUIRE(st);
  const auto& s = std::get<proto::StatsReply>(st->payload);
  REQUIRE(s.objects == 4);
  REQUIRE(s.leases == 0);
  REQUIRE(s.reservations == 0);
  // A save after the restart is stored and found like any other.
  REQUIRE(saved(a, a.save_spec("a4", 4, 0, 2, Rig::block_range(24, 8))));
  REQUIRE(hit(b, 4, 0, 2) == 128);
}

TEST_CASE("arena recovery: an arena of another format version starts empty, saying so in one line",
          "[server][reactor][fault]") {
  if (!device_present()) return;
  ArenaFile file;
  const std::string socket = ServerProcess::fresh_socket_path();
  {
    auto srv = start_logged(socket, file);
    Rig r(remote(socket));
    REQUIRE(saved(r, r.save_spec("a", 1, 0, 2, Rig::block_range(0, 8))));
    r.conn->close();
    srv->signal(SIGTERM);
    srv->wait();
  }
  const std::uint32_t later = tier::kObjectTableVersion + 1;
  file.patch(8, &later, sizeof later);  // slab 0's header: its format version
  auto srv = start_logged(socket, file);
  REQUIRE(srv->wait_for_output("starting empty", 10s));
  INFO(srv->output());
  REQUIRE(srv->output().find("format version " + std::to_string(later)) != std::string::npos);
  Rig r(remote(socket));
  REQUIRE(hit(r, 1, 0, 2) == 0);  // nothing of the unreadable arena is served
  REQUIRE(saved(r, r.save_spec("b", 2, 0, 2, Rig::block_range(0, 8))));
  REQUIRE(hit(r, 2, 0, 2) == 128);
  ::unlink(socket.c_str());
}

TEST_CASE("arena recovery: a corrupted table entry drops its object only", "[server][reactor][fault]") {
  if (!device_present()) return;
  ArenaFile file;
  const std::string socket = ServerProcess::fresh_socket_path();
  std::vector<std::byte> before;
  const auto src = Rig::block_range(0, 12);  // three chunks
  {
    auto srv = start_logged(socket, file);
    Rig r(remote(socket));
    r.randomize(4);
    before = r.snapshot(Rig::block_range(0, 4), {0});  // chunk 0: its blocks, and its image (slot 0)
    REQUIRE(saved(r, r.save_spec("a", 1, 0, 3, src)));
    r.conn->close();
    srv->signal(SIGTERM);
    srv->wait();
  }
  const std::uint8_t junk = 0x5a;
  file.patch(tier::kSlabHeaderBytes + 1 * tier::kEntryBytes + 40, &junk, 1);  // chunk 1's entry, in its key
  auto srv = start_logged(socket, file);
  REQUIRE(srv->wait_for_output("recovered 2 objects", 10s));
  INFO(srv->output());
  REQUIRE(srv->output().find("1 corrupt dropped") != std::string::npos);
  Rig r(remote(socket));
  REQUIRE(hit(r, 1, 0, 3) == 64);   // the run stops at the dropped chunk
  REQUIRE(hit(r, 1, 2, 3) == 64);   // the chunk after it is there
  REQUIRE(hit(r, 1, 1, 2) == 0);
  // Chunk 0 loads exactly as it was saved.
  r.randomize(5);
  const auto dst = Rig::block_range(40, 4);
  r.conn->load(r.load_spec("l", 1, 0, 1, dst, 6));
  const auto f = r.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
  INFO(f.loads[0].reason);
  REQUIRE(f.loads[0].ok);
  REQUIRE(r.snapshot(dst, {6}) == before);
  ::unlink(socket.c_str());
}

TEST_CASE("arena recovery: the memory a named arena holds counts as the restarted server's own", "[server]") {
  ArenaFile file;
  REQUIRE(tier::held_by_named_arena(file.path, 8u << 20) == 0);  // none yet
  {
    tier::Arena arena(tier::ArenaOptions{8u << 20, 2u << 20, false, file.path});
    REQUIRE_FALSE(arena.reopened());
    REQUIRE(tier::held_by_named_arena(file.path, 8u << 20) == 0);  // created, not populated
    for (std::uint32_t s = 0; s < arena.slab_count(); ++s) REQUIRE(arena.populate(s).empty());
  }
  // What --tier-bytes is checked against at the restart: MemAvailable, which
  // no longer counts these pages, plus them.
  REQUIRE(tier::held_by_named_arena(file.path, 8u << 20) == 8u << 20);
  REQUIRE(tier::held_by_named_arena(file.path, 16u << 20) == 0);  // another size: made again, nothing reused
  tier::Arena again(tier::ArenaOptions{8u << 20, 2u << 20, false, file.path});
  REQUIRE(again.reopened());
}

TEST_CASE("arena recovery: a server restarted on a named arena the machine could not hold twice starts",
          "[server][fault]") {
  ArenaFile file;
  {
    tier::Arena arena(tier::ArenaOptions{64u << 20, 8u << 20, false, file.path});
    for (std::uint32_t s = 0; s < arena.slab_count(); ++s) REQUIRE(arena.populate(s).empty());
  }
  // The machine has 16 MiB left: the 64 MiB the file holds are the restarted
  // server's own; a server on another path would need them again.
  ::setenv("KVSTRAND_TEST_MEM_AVAILABLE_MIB", "16", 1);
  const std::string server = sibling_binary("../kvstrand-server");
  const std::string socket = ServerProcess::fresh_socket_path();
  auto refused = run_process({server, "--socket", socket, "--tier-bytes", "64M", "--slab-bytes", "8M",
                              "--arena-path", file.path + "-other"});
  ChildProcess restarted({server, "--socket", socket, "--tier-bytes", "64M", "--slab-bytes", "8M", "--arena-path",
                          file.path, "--log-level", "info"});
  ::unsetenv("KVSTRAND_TEST_MEM_AVAILABLE_MIB");
  INFO(refused.output);
  REQUIRE(refused.exit_code == 2);
  REQUIRE(refused.output.find("--tier-bytes") != std::string::npos);
  INFO(restarted.output());
  REQUIRE(restarted.wait_for_output("recovered 0 objects", 10s));
  ::unlink(socket.c_str());
}

TEST_CASE("arena recovery: a second server on a named arena in use is refused, naming it", "[server]") {
  ArenaFile file;
  ServerProcess first(flags(file));
  REQUIRE(first.ready());
  auto second = run_process({sibling_binary("../kvstrand-server"), "--socket", ServerProcess::fresh_socket_path(),
                             "--tier-bytes", "32M", "--slab-bytes", "8M", "--arena-path", file.path});
  INFO(second.output);
  REQUIRE(second.exit_code != 0);
  REQUIRE(second.output.find("another kvstrand-server uses " + file.path) != std::string::npos);
  first.kill(SIGKILL);  // its lock goes with it: the next server takes the arena
  ServerProcess next(flags(file));
  REQUIRE(next.ready());
}

TEST_CASE("arena recovery: a lock file another user made first is refused as not the server's, naming it",
          "[server]") {
  if (::geteuid() != 0) return;  // making a file another user's needs root
  ArenaFile file;
  // In /dev/shm anyone may create it first, and hold it locked for ever.
  const std::string lock = file.path + ".lock";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  REQUIRE(fd >= 0);
  REQUIRE(::fchown(fd, 4242, 4242) == 0);
  ::close(fd);
  auto refused = run_process({sibling_binary("../kvstrand-server"), "--socket", ServerProcess::fresh_socket_path(),
                              "--tier-bytes", "32M", "--slab-bytes", "8M", "--arena-path", file.path});
  INFO(refused.output);
  REQUIRE(refused.exit_code != 0);
  REQUIRE(refused.output.find("--arena-path") != std::string::npos);
  REQUIRE(refused.output.find("owned by uid 4242") != std::string::npos);
  ::unlink(lock.c_str());  // gone: the server makes its own
  ServerProcess next(flags(file));
  REQUIRE(next.ready());
}
