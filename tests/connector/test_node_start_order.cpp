// The node tier started in any order with its server: an engine up before
// its server, registrations made while it is down, a server killed or
// restarted, refusing or refused; each attaches when a server answers,
// with no request of the engine's needed.
#include <signal.h>

#include "connector_rig.hpp"
#include "node_tier_support.hpp"
#include "server_process.hpp"
#include "support.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using kvstrand::TransferErrc;
using kvstrand::TransferRefused;

TEST_CASE("node tier: an engine started 2 s before its server registers, misses, then saves and hits once the "
          "server is up", "[server][reactor][fault]") {
  if (!device_present()) return;
  const std::string path = ServerProcess::fresh_socket_path();
  connector::ConnectorOptions o;
  o.server_socket = path;
  o.server_request_timeout = 2s;
  Rig rig(o);  // no server yet: registered all the same (before: TransferRefused, tier_unavailable)
  // Misses, not errors; and turned away between connect attempts, which
  // back off (before: a connect for every request).
  for (int i = 0; i < 100; ++i) REQUIRE(lookup_tokens(rig, rig.keys(1, 0, 2)) == 0);
  rig.conn->save(rig.save_spec("early", 1, 0, 2, Rig::block_range(0, 8)));
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  REQUIRE_FALSE(f.saves[0].ok);
  REQUIRE(f.saves[0].error == TransferErrc::tier_unavailable);
  std::this_thread::sleep_for(2s);
  ServerProcess srv(kServerFlags, path);
  REQUIRE(ready_and_full(srv));
  const auto src = Rig::block_range(0, 8);
  const auto before = rig.snapshot(src, {1});
  REQUIRE(save_until_ok(rig, rig.save_spec("a", 1, 0, 2, src)));  // attached within the backoff (2 s at most)
  rig.conn->lookup(rig.keys(1, 0, 2));
  const auto hit = rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); }).lookups[0];
  REQUIRE(hit.hit.tokens == 128);
  rig.randomize(2);
  const auto dst = Rig::block_range(30, 8);
  kv::TransferSpec load = rig.load_spec("a", 1, 0, 2, dst, 6);
  load.tier_lease = hit.lease;
  rig.conn->load(load);
  f = rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
  INFO(f.loads[0].reason);
  REQUIRE(f.loads[0].ok);
  REQUIRE(rig.snapshot(dst, {6}) == before);
  const auto counts = rig.conn->arena_mappings();
  REQUIRE(counts.turned_away >= 90);
  REQUIRE(counts.connect_attempts <= 20);
}

TEST_CASE("node tier: a second registration made while the server is down attaches when it returns",
          "[server][reactor][fault]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv));
  srv.kill(SIGKILL);
  rig.add_swa_group();  // the server is gone (before: TransferRefused)
  REQUIRE(rig.swa->id == 1);
  srv.restart(kServerFlags);
  REQUIRE(ready_and_full(srv));
  kv::TransferSpec s;
  s.registration = rig.swa->id;
  s.tokens = {0, 2 * rig.layout.chunk_tokens};
  s.keys = rig.swa_keys(1, 2);
  s.blocks = {3, 17, 30, 4};
  REQUIRE(save_until_ok(rig, s));
  REQUIRE(lookup_tokens(rig, rig.swa_keys(1, 2), rig.swa->id) == 128);
  REQUIRE(save_until_ok(rig, rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8))));  // the first one too
  REQUIRE(lookup_tokens(rig, rig.keys(1, 0, 2)) == 128);
}

TEST_CASE("node tier: a server SIGKILLed and restarted while an engine registers: every registration attaches, "
          "none stops the engine", "[server][reactor][fault]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv));
  std::atomic<int> registered{0};
  std::string failed;
  std::thread engine([&] {
    for (int i = 0; i < 30; ++i) {
      kvstrand::Registration reg;  // lookup-only registrations of 30 other layouts
      reg.layout = rig.layout;
      reg.layout.layout_name = "rig-" + std::to_string(i);
      try {
        if (rig.conn->register_layout(reg) != static_cast<std::uint32_t>(i + 1)) failed = "an id out of order";
        ++registered;
      } catch (const std::exception& e) {
        failed = e.what();
        return;
      }
      std::this_thread::sleep_for(30ms);
    }
  });
  while (registered < 5) std::this_thread::sleep_for(5ms);
  srv.kill(SIGKILL);
  std::this_thread::sleep_for(300ms);
  srv.restart(kServerFlags);
  engine.join();
  INFO(failed);
  REQUIRE(failed.empty());
  REQUIRE(registered == 30);
  REQUIRE(ready_and_full(srv));
  REQUIRE(save_until_ok(rig, rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8))));
  REQUIRE(lookup_tokens(rig, rig.keys(1, 0, 2)) == 128);
  for (std::uint32_t id : {1u, 15u, 30u}) {  // each is the server's again: a lookup of it is answered
    auto keys = kv::chunk_keys(rig.layout, kv::namespace_of([&] {
                                 kv::Layout l = rig.layout;
                                 l.layout_name = "rig-" + std::to_string(id - 1);
                                 return l;
                               }()), std::vector<std::uint32_t>(128, 5));
    REQUIRE(lookup_tokens(rig, keys, id) == 0);
  }
}

TEST_CASE("node tier: a registration a restarted server refuses runs without the tier, said once, and attaches to "
          "a server that takes it", "[server][reactor][fault]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv));
  REQUIRE(save_until_ok(rig, rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8))));
  std::vector<std::string> other = kServerFlags;
  other.back() = "128";  // --chunk-tokens 128: this layout's 64-token chunks are refused
  srv.restart(other);
  REQUIRE(ready_and_full(srv));
  bool refused = false;
  for (int attempt = 0; attempt < 50 && !refused; ++attempt) {
    rig.conn->save(rig.save_spec("b" + std::to_string(attempt), 1, 0, 2, Rig::block_range(0, 8)));
    auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
    REQUIRE_FALSE(f.saves[0].ok);
    refused = f.saves[0].error == TransferErrc::bad_spec;
    if (refused) REQUIRE(f.saves[0].reason.find("--chunk-tokens") != std::string::npos);
    std::this_thread::sleep_for(100ms);
  }
  REQUIRE(refused);
  REQUIRE(lookup_tokens(rig, rig.keys(1, 0, 2)) == 0);  // a miss, no exception
  // Restarted again, refusing the same way: the engine reconnects, and the
  // refusal it knows is not said (nor counted) again.
  const std::uint64_t reconnects = rig.conn->arena_mappings().reconnects;
  srv.restart(other);
  REQUIRE(ready_and_full(srv));
  for (int attempt = 0; attempt < 100 && rig.conn->arena_mappings().reconnects == reconnects; ++attempt) {
    rig.conn->save(rig.save_spec("r" + std::to_string(attempt), 1, 0, 2, Rig::block_range(0, 8)));
    rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
    std::this_thread::sleep_for(100ms);
  }
  REQUIRE(rig.conn->arena_mappings().reconnects > reconnects);
  REQUIRE(rig.conn->arena_mappings().refusals == 1);
  srv.restart(kServerFlags);
  REQUIRE(ready_and_full(srv));
  REQUIRE(save_until_ok(rig, rig.save_spec("c", 1, 0, 2, Rig::block_range(0, 8)), 15s));
  REQUIRE(rig.conn->arena_mappings().refusals == 1);
}

TEST_CASE("node tier: a server that answers and refuses a registration refuses it to the engine at once",
          "[server][reactor]") {
  std::vector<std::string> other = kServerFlags;
  other.back() = "128";
  ServerProcess srv(other);
  REQUIRE(srv.ready());
  try {
    Rig rig(remote(srv));
    FAIL("registered a layout the server refused");
  } catch (const TransferRefused& e) {
    REQUIRE(e.code() == TransferErrc::bad_spec);
    REQUIRE(std::string(e.what()).find("--chunk-tokens") != std::string::npos);
  }
}

TEST_CASE("node tier: the same connector reconnects to a server restarted on its socket", "[server][reactor][fault]") {
  if (!device_present()) return;
  auto srv = std::make_unique<ServerProcess>(kServerFlags);
  REQUIRE(ready_and_full(*srv));
  const std::string path = srv->socket_path();
  Rig rig(remote(*srv));
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);

  srv->kill(SIGKILL);  // the tier (and what it held) is gone
  srv->restart(kServerFlags);
  REQUIRE(ready_and_full(*srv));
  serves_anew_after_restart(rig);  // prompt 1's objects died with the old server
}

TEST_CASE("node tier: an engine idle since before its server started attaches and pins the arena without a "
          "request of its own, and again after the server restarts", "[server][reactor][fault]") {
  if (!device_present()) return;
  const std::string path = ServerProcess::fresh_socket_path();
  connector::ConnectorOptions o;
  o.server_socket = path;
  o.server_request_timeout = 2s;
  Rig rig(o);  // no server yet; and no request is made until the arena is pinned
  ServerProcess srv(kServerFlags, path);
  REQUIRE(ready_and_full(srv));
  // Attached in the background within the backoff (2 s at most), and the
  // whole arena pinned for this process's device; before: attached only at
  // the next request, so the first one after an idle start paid the pinning.
  auto pinned = [&](std::uint64_t mapped) {
    const auto end = std::chrono::steady_clock::now() + 20s;
    for (;;) {
      const auto link = rig.conn->arena_mappings();
      if (link.mapped == mapped && link.arena_bytes > 0 && link.pinned_bytes == link.arena_bytes) return true;
      if (std::chrono::steady_clock::now() > end) {
        INFO("mapped " << link.mapped << ", pinned " << link.pinned_bytes << " of " << link.arena_bytes);
        return false;
      }
      std::this_thread::sleep_for(10ms);
    }
  };
  REQUIRE(pinned(1));
  // A restarted server (a new arena): mapped and pinned again, still unasked.
  srv.kill(SIGKILL);
  srv.restart(kServerFlags);
  REQUIRE(ready_and_full(srv));
  REQUIRE(pinned(2));
  // And it serves at once: the first save after all that is ok.
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  INFO(f.saves[0].reason);
  REQUIRE(f.saves[0].ok);
}

TEST_CASE("node tier: a server run by another user is not spoken to unless server_uid names it",
          "[server][reactor][tenants]") {
  if (!device_present() || ::geteuid() != 0 || ::access("/usr/bin/setpriv", X_OK) != 0) return;
  // A user who binds a shared socket path first received every engine's KV
  // and served its own bytes as hits: nothing checked who the server was.
  const std::string path = ServerProcess::fresh_socket_path();
  ChildProcess theirs({"/usr/bin/setpriv", "--reuid=4242", "--regid=4242", "--clear-groups",
                       sibling_binary("../kvstrand-server"), "--socket", path, "--tier-bytes", "32M", "--slab-bytes",
                       "8M", "--chunk-tokens", "64", "--log-level", "info"});
  REQUIRE(theirs.wait_for_output("listening on", 30s));
  auto save = [&](std::int64_t server_uid) {
    connector::ConnectorOptions o;
    o.server_socket = path;
    o.server_request_timeout = 2s;
    o.server_uid = server_uid;
    Rig rig(o);
    rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
    return rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0];
  };
  const auto refused = save(-1);
  INFO(refused.reason);
  REQUIRE_FALSE(refused.ok);
  REQUIRE(refused.error == TransferErrc::tier_unavailable);  // the tier is a cache: a miss, never the engine
  REQUIRE(refused.reason.find("run by uid 4242") != std::string::npos);
  REQUIRE(refused.reason.find("server_uid") != std::string::npos);
  // Named: spoken to, and (this client being root, an admin to any server) served.
  const auto named = save(4242);
  INFO(named.reason);
  REQUIRE(named.ok);
  theirs.signal(SIGTERM);
  theirs.wait();
}
