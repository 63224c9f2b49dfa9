// The Connector over the node tier (RemoteIndex) and a real kvstrand-server process: the same
// copy path as the embedded tier (this process copies, the server keeps the index),
// and what happens when the server stops, dies, stops reading or comes back
// on its socket (F14, F20, F23, reconnect).
#include <signal.h>

#include "arena_file.hpp"
#include "connector_rig.hpp"
#include "curl.hpp"
#include "tier/arena.hpp"
#include "channel/fd_passing.hpp"
#include "proto/lease_handoff.hpp"
#include "node_tier_support.hpp"
#include "protocol_session.hpp"
#include "server_process.hpp"
#include "support.hpp"
#include "wrong_reply_server.hpp"
#include "device/sim_hooks.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using kvstrand::FailStop;
using kvstrand::TransferErrc;
using kvstrand::TransferRefused;

TEST_CASE("node tier: save, lookup, load through the server restore KV and state byte for byte", "[server][reactor][gpu]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv));
  rig.round_trip();  // the same round trip as the embedded tier's test
}

TEST_CASE("node tier: two groups of different object sizes share the server's arena and load byte for byte",
          "[server][reactor][gpu]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv));
  rig.two_group_round_trip();  // the same as the embedded tier's
}

namespace {

// Saves and looks up through a server, then stops it with `signal` (and
// leaves it so) before the load: the leased objects are in this process's
// mapping, so the load copies them exactly without asking the server.
void leased_load_without_server(int signal) {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv));
  const auto src = Rig::block_range(0, 8);
  const auto before = rig.snapshot(src, {1});
  const auto lease = save_and_look_up(rig, src).lease;
  REQUIRE(lease != 0);
  srv.kill(signal);  // returns once the server is stopped (SIGSTOP) or reaped (SIGKILL)
  rig.randomize(2);
  const auto dst = Rig::block_range(20, 8);
  auto spec = rig.load_spec("a", 1, 0, 2, dst, 3);
  spec.tier_lease = lease;
  rig.conn->load(spec);
  const auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
  INFO(f.loads[0].reason);
  REQUIRE(f.loads[0].ok);
  REQUIRE(rig.snapshot(dst, {3}) == before);
  if (signal == SIGSTOP) srv.kill(SIGCONT);
}

}  // namespace

TEST_CASE("node tier: a server SIGSTOPped during a load: the load completes exactly without it",
          "[server][reactor][fault]") {
  leased_load_without_server(SIGSTOP);
}

TEST_CASE("node tier: a server SIGKILLed during a store: the store fails cleanly, a restarted server serves exact data",
          "[server][reactor][fault][sim]") {
  if (!device_present() || !sim_hooks_present()) return;
  auto srv = std::make_unique<ServerProcess>(kServerFlags);
  REQUIRE(ready_and_full(*srv));
  const std::string path = srv->socket_path();
  Rig rig(remote(*srv));
  REQUIRE(rig.streams.save != nullptr);
  require_ok(device::sim::hold_stream(rig.save_stream()));  // the copy waits until released
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (rig.conn->transfers().empty() || rig.conn->transfers()[0].state != connector::TransferState::pending)
    REQUIRE(std::chrono::steady_clock::now() < end);  // reserved; the copy is queued
  srv->kill(SIGKILL);
  require_ok(device::sim::release_stream(rig.save_stream()));
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  REQUIRE_FALSE(f.saves[0].ok);  // copied, never committed: not stored, and no fail-stop
  REQUIRE(f.saves[0].error == TransferErrc::tier_unavailable);

  srv->restart(kServerFlags);
  REQUIRE(ready_and_full(*srv));
  serves_anew_after_restart(rig);  // prompt 1's store never became readable
}

TEST_CASE("node tier: a stopped server is fail-stop at the transfer's deadline, never a hang", "[server][reactor][fault]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv, 300ms));
  srv.kill(SIGSTOP);
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  const std::error_code code = wait_fail_stop(rig);
  srv.kill(SIGCONT);
  REQUIRE(code == TransferErrc::deadline_exceeded);
}

namespace {
// The server is SIGKILLed and restarted with `flags` while the rig holds a
// lease; another process takes a lease on the new server. Hold ids are
// random (48 bits), so the new server all but never gives the old id again,
// and it would answer another process's release as unknown anyway: what is
// checked is that the rig never sends the old server's hold to the new one.
void hold_of_restarted_server_is_never_released(std::vector<std::string> flags) {
  const auto port = free_port();
  flags.insert(flags.end(), {"--http", "127.0.0.1:" + std::to_string(port)});
  ServerProcess srv(flags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv));
  const auto hit = save_and_look_up(rig, Rig::block_range(0, 8));
  REQUIRE(hit.lease != 0);

  srv.restart(flags);  // SIGKILLed: its holds are gone
  REQUIRE(ready_and_full(srv));
  // Another process, with objects of the rig's size: a reservation, then a lease, as the rig did.
  Client other(srv.socket_path());
  REQUIRE(must_call(other, Hello{kMajor, kMinor, "test", {}}).status == Status::ok);
  const std::uint32_t reg = std::get<RegisterReply>(must_call(other, RegisterLayout{rig.layout}).payload).registration;
  const auto stored = std::get<ReserveReply>(must_call(other, Reserve{reg, rig.keys(7, 0, 2), {0, 0}}).payload);
  REQUIRE(must_call(other, Commit{stored.reservation, true}).status == Status::ok);
  const auto theirs = std::get<LookupReply>(must_call(other, Lookup{reg, rig.keys(7, 0, 2)}).payload);
  REQUIRE(theirs.lease != 0);

  rig.conn->release_lookup(hit.lease);      // not sendable now: queued for the next connection
  rig.conn->lookup(rig.keys(1, 0, 2));      // which this makes
  // A hit where the arena kept the rig's objects (named): its own new lease, given back.
  const auto again = rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); }).lookups[0];
  if (again.lease != 0) rig.conn->release_lookup(again.lease);
  std::this_thread::sleep_for(200ms);       // a release, had one been sent, has been served
  const StatsReply st = stats(srv.socket_path());
  CHECK(st.leases == 1);  // the other process's lease stands
  CHECK(st.pinned == 2);
  // The old server's hold was never sent to the new one.
  if (curl_present())
    CHECK(curl(port, "/metrics").body.find("type=\"release\",status=\"unknown_hold\"") == std::string::npos);
}
}  // namespace

TEST_CASE("node tier: a hold of a server that restarted is never released on the new one, where its id names "
          "another process's hold",
          "[server][reactor][fault]") {
  if (!device_present()) return;
  hold_of_restarted_server_is_never_released(kServerFlags);
}

TEST_CASE("node tier: the same, the server restarted on its named arena (the client keeps its mapping, not its holds)",
          "[server][reactor][fault]") {
  if (!device_present()) return;
  ArenaFile file;
  auto flags = kServerFlags;
  flags.insert(flags.end(), {"--arena-path", file.path});
  hold_of_restarted_server_is_never_released(flags);
}

TEST_CASE("node tier: a save reserved on a server that restarted is never committed on the new one", "[server][reactor][fault][sim]") {
  if (!device_present() || !sim_hooks_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv));
  require_ok(device::sim::hold_stream(rig.save_stream()));  // reserved; the copy waits
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (rig.conn->transfers().empty() || rig.conn->transfers()[0].state != connector::TransferState::pending)
    REQUIRE(std::chrono::steady_clock::now() < end);

  srv.restart(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Client other(srv.socket_path());  // its first hold gets the id the rig's reservation had
  const std::uint32_t reg = open_session(other);
  const auto theirs = std::get<ReserveReply>(must_call(other, Reserve{reg, keys(7, 2), {0, 0}}).payload);
  // The rig attaches to the restarted server (a new arena mapped) in the background.
  const auto attached = std::chrono::steady_clock::now() + 10s;
  while (rig.conn->arena_mappings().mapped < 2) {
    REQUIRE(std::chrono::steady_clock::now() < attached);
    std::this_thread::sleep_for(10ms);
  }
  require_ok(device::sim::release_stream(rig.save_stream()));
  const auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  CHECK_FALSE(f.saves[0].ok);
  CHECK(f.saves[0].reason.find("restarted") != std::string::npos);
  // The other process's reservation was not committed under it: still its own to commit.
  CHECK(must_call(other, Commit{theirs.reservation, true}).status == Status::ok);
}

TEST_CASE("node tier: a leased load needs no server: it copies exactly what was saved after the server died",
          "[server][reactor][fault]") {
  leased_load_without_server(SIGKILL);  // and not restarted: nothing answers on the socket
}

TEST_CASE("node tier: a lease its server lost (killed, restarted) ends its load within 10 s: the bytes it was granted, "
          "or a clean failure (F26)",
          "[server][reactor][fault]") {
  if (!device_present()) return;
  auto srv = std::make_unique<ServerProcess>(kServerFlags);
  REQUIRE(ready_and_full(*srv));
  const std::string path = srv->socket_path();
  Rig rig(remote(*srv));  // a 60 s deadline: a load that hung would outlast wait_for's 10 s
  const auto src = Rig::block_range(0, 8);
  const auto before = rig.snapshot(src, {1});
  const auto hit = save_and_look_up(rig, src);
  REQUIRE(hit.hit.tokens == 128);
  REQUIRE(hit.lease != 0);

  srv->kill(SIGKILL);  // the lease dies with the server
  srv->restart(kServerFlags);
  REQUIRE(ready_and_full(*srv));
  rig.randomize(2);
  const auto dst = Rig::block_range(20, 8);
  auto spec = rig.load_spec("a", 1, 0, 2, dst, 6);
  spec.tier_lease = hit.lease;
  rig.conn->load(spec);
  const auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
  INFO(f.loads[0].reason);
  if (f.loads[0].ok) {
    // Copied from the mapping the lease was granted in, which this process
    // keeps while a lease names it: what was saved, byte for byte.
    REQUIRE(rig.snapshot(dst, {6}) == before);
  } else {
    REQUIRE((f.loads[0].error == TransferErrc::missing_chunk || f.loads[0].error == TransferErrc::tier_unavailable));
    REQUIRE(f.loads[0].blocks == dst);  // exactly its blocks, for the engine to recompute
  }
}

TEST_CASE("node tier: saves queued behind a server that stops reading cannot delay the deadline (F14)",
          "[server][reactor][fault]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv, 500ms));
  srv.kill(SIGSTOP);
  // Far more request bytes than the socket buffers hold: the writer blocks.
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 4000; ++i) rig.conn->save(rig.save_spec("s" + std::to_string(i), 100 + i, 0, 1, Rig::block_range(0, 4)));
  const std::error_code code = wait_fail_stop(rig);
  const auto took = std::chrono::steady_clock::now() - t0;
  srv.kill(SIGCONT);
  REQUIRE(code == TransferErrc::deadline_exceeded);
  // The first deadline (500 ms) ended it, not the blocked writer: the server
  // was stopped the whole time.
  REQUIRE(took < 5s);
}

TEST_CASE("node tier: a load whose lookup the server never answers ends at its deadline (F23)", "[server][reactor][fault]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv, 400ms));
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);
  srv.kill(SIGSTOP);
  rig.conn->load(rig.load_spec("a", 1, 0, 1, Rig::block_range(20, 4), 3));
  const std::error_code code = wait_fail_stop(rig);
  srv.kill(SIGCONT);
  REQUIRE(code == TransferErrc::deadline_exceeded);
}

TEST_CASE("node tier: close() while the stopped server holds a lookup answers it (a miss) before returning",
          "[server][reactor][fault]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  auto o = remote(srv, 1s);
  o.server_request_timeout = 30s;  // the lookup's own bound is far off: close() is what ends it
  Rig rig(o);
  srv.kill(SIGSTOP);
  const std::uint64_t id = rig.conn->lookup(rig.keys(1, 0, 2));
  std::this_thread::sleep_for(50ms);  // the request is on the wire
  const auto t0 = std::chrono::steady_clock::now();
  rig.conn->close();
  const auto took = std::chrono::steady_clock::now() - t0;
  srv.kill(SIGCONT);
  REQUIRE(took < connector::close_bound(1s));
  // Every lookup id gets its answer, also across close(): the engine may be
  // deferring a request on it.
  const kvstrand::Finished f = rig.conn->finished();
  REQUIRE(f.lookups.size() == 1);
  REQUIRE(f.lookups[0].id == id);
  REQUIRE(f.lookups[0].hit.tokens == 0);
}

TEST_CASE("node tier: invalidate drops the namespace on the server: no lookup hits it, a save stores it anew",
          "[server][reactor]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv));
  rig.invalidate_round();
}

TEST_CASE("node tier: invalidate is refused, naming the protocol, by a server older than 2.3, which is never sent it",
          "[server][reactor]") {
  if (!device_present()) return;
  WrongReplyServer srv(WrongReplyServer::speaking_minor(2));
  connector::ConnectorOptions o;
  o.server_socket = srv.socket_path();
  Rig rig(o);
  try {
    rig.conn->invalidate();
    FAIL("invalidate returned against a 2.2 server");
  } catch (const TransferRefused& e) {
    REQUIRE(e.code() == TransferErrc::tier_unavailable);
    REQUIRE_THAT(e.what(), Catch::Contains("protocol 2.2") && Catch::Contains("needs 2.3"));
  }
  REQUIRE(srv.drops() == 0);
}

TEST_CASE("node tier: chunk events go to a 2.4 server with the reserve, and never to a 2.3 one, whose saves go on "
          "without them",
          "[server][reactor][events]") {
  if (!device_present()) return;
  for (std::uint8_t minor : {std::uint8_t{3}, std::uint8_t{4}}) {
    INFO("server 2." << int(minor));
    WrongReplyServer srv(WrongReplyServer::speaking_minor(minor));
    connector::ConnectorOptions o;
    o.server_socket = srv.socket_path();
    Rig rig(o);
    kv::TransferSpec s = rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8));
    s.chunk_events.assign(s.keys.size(), std::string("\x81\xa1x\x01", 4));
    rig.conn->save(std::move(s));
    const auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
    REQUIRE(f.saves[0].ok);
    REQUIRE(srv.described() == (minor >= 4 ? 1 : 0));
  }
}

TEST_CASE("node tier: a layout's tenant is told to a 2.4 server, never to a 2.3 one, which serves it all the same",
          "[server][reactor][tenants]") {
  if (!device_present()) return;
  for (std::uint8_t minor : {std::uint8_t{3}, std::uint8_t{4}}) {
    INFO("server 2." << int(minor));
    WrongReplyServer srv(WrongReplyServer::speaking_minor(minor));
    connector::ConnectorOptions o;
    o.server_socket = srv.socket_path();
    Rig rig(o, 64, "team-a");
    rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
    const auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
    REQUIRE(f.saves[0].ok);
    REQUIRE(srv.tenants() == (minor >= 4 ? 1 : 0));
  }
}

TEST_CASE("node tier: a lookup whose hit is not loaded gives its lease back at once (F20)", "[server][reactor][gpu]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv));
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);
  auto locks = [&] {
    Client c(srv.socket_path());
    REQUIRE(c.call(proto::Hello{proto::kMajor, proto::kMinor, "t", {}}).has_value());
    return std::get<proto::StatsReply>(c.call(proto::Stats{})->payload).leases;
  };
  const auto keys = rig.keys(1, 0, 2);
  rig.conn->lookup(keys);
  auto looked = rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); });
  REQUIRE(looked.lookups[0].hit.tokens == 128);
  REQUIRE(locks() == 1);  // held for a load that will not come, and no clock frees it
  rig.conn->release_lookup(looked.lookups[0].lease);
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (locks() != 0) {
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(20ms);
  }
  // The object is unlocked, not gone: a later lookup and load still work.
  rig.conn->lookup(keys);
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); }).lookups[0].hit.tokens == 128);
  rig.conn->load(rig.load_spec("a", 1, 0, 2, Rig::block_range(30, 8), 4));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); }).loads[0].ok);
}

TEST_CASE("node tier: a reply of another type than its request is a protocol error: the request fails with it",
          "[server][reactor][fault]") {
  if (!device_present()) return;
  WrongReplyServer srv(WrongReplyServer::wrong_types());
  connector::ConnectorOptions o;
  o.server_socket = srv.socket_path();
  o.server_request_timeout = 2s;
  Rig rig(o);
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  const auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  INFO(f.saves[0].reason);
  REQUIRE_FALSE(f.saves[0].ok);
  REQUIRE(f.saves[0].error == TransferErrc::tier_unavailable);  // not an exception escaping the coroutine
  REQUIRE(f.saves[0].reason.find("protocol error: a lookup reply to reserve request") != std::string::npos);
  // The lookup's answer (a reserve reply, on a new connection) is a miss, not a throw.
  rig.conn->lookup(rig.keys(1, 0, 1));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); }).lookups[0].hit.tokens == 0);
}

TEST_CASE("node tier: an arena offset the server grants past the arena is refused, and nothing is copied",
          "[server][reactor][fault]") {
  if (!device_present()) return;
  for (std::uint64_t past : {std::uint64_t{0}, std::uint64_t{1}}) {
    INFO("offsets " << past << " B past the last object that fits");
    WrongReplyServer srv(WrongReplyServer::offsets_past(past));
    connector::ConnectorOptions o;
    o.server_socket = srv.socket_path();
    o.server_request_timeout = 2s;
    Rig rig(o);
    rig.conn->save(rig.save_spec("s", 1, 0, 1, Rig::block_range(0, 4)));
    const auto saved = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0];
    const auto dst = Rig::block_range(8, 4);
    const auto before = rig.snapshot(dst, {3});
    rig.conn->load(rig.load_spec("l", 1, 0, 1, dst, 3));
    const auto loaded = rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); }).loads[0];
    INFO("save: " << saved.reason << "; load: " << loaded.reason);
    if (past == 0) {  // the last object of the arena: inside, used
      REQUIRE(saved.ok);
      REQUIRE(loaded.ok);
      continue;
    }
    REQUIRE_FALSE(saved.ok);
    REQUIRE(saved.reason.find("outside its arena") != std::string::npos);
    REQUIRE_FALSE(loaded.ok);
    REQUIRE(loaded.reason.find("outside its arena") != std::string::npos);
    REQUIRE(rig.snapshot(dst, {3}) == before);  // the refused load wrote nothing
  }
}

TEST_CASE("node tier: a registration with no memory looks up and exports a lease, and refuses to copy",
          "[server][reactor]") {
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv));
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);

  // A scheduler: the same layout, no device memory.
  connector::Connector scheduler(remote(srv));
  Registration plan_only;
  plan_only.layout = rig.layout;
  REQUIRE(scheduler.register_layout(plan_only) == 0);
  const std::uint64_t id = scheduler.lookup(rig.keys(1, 0, 2));
  kvstrand::Finished f;
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (f.lookups.empty() && std::chrono::steady_clock::now() < end) {
    f = scheduler.finished();
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE(f.lookups.size() == 1);
  REQUIRE(f.lookups[0].id == id);
  REQUIRE(f.lookups[0].hit.tokens == 128);
  REQUIRE_FALSE(scheduler.export_lease(f.lookups[0].lease).empty());
  try {
    scheduler.save(rig.save_spec("b", 2, 0, 1, Rig::block_range(0, 4)));
    FAIL("a save through a registration without memory was posted");
  } catch (const TransferRefused& e) {
    REQUIRE(e.code() == TransferErrc::bad_spec);
    REQUIRE(std::string(e.what()).find("serves lookups only") != std::string::npos);
  }
}

TEST_CASE("node tier: a reserve granted after its save gave up is released when the late reply comes",
          "[server][reactor][fault]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv, 300ms));
  srv.kill(SIGSTOP);
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  REQUIRE(wait_fail_stop(rig) == TransferErrc::deadline_exceeded);
  std::this_thread::sleep_for(200ms);  // past the request's own timeout (deadline + 50 ms): abandoned
  srv.kill(SIGCONT);  // the server now grants the reserve; its reply finds no one waiting
  const auto end = std::chrono::steady_clock::now() + 10s;
  proto::StatsReply s = stats(srv.socket_path());
  while (s.reservations != 0 && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(20ms);
    s = stats(srv.socket_path());
  }
  REQUIRE(s.reservations == 0);  // released by this process, not left until it exits
  REQUIRE(s.objects == 0);
  REQUIRE(s.sessions >= 2);  // the rig's connection is still open: nothing was freed by a close
}

TEST_CASE("node tier: a partial hit's exported lease names only the hit's chunks, and a load that names a lease ends it",
          "[server][reactor]") {
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Rig rig(remote(srv));
  const auto hit = save_and_look_up(rig, Rig::block_range(0, 8));
  REQUIRE(hit.hit.tokens == 128);
  // Four chunks asked, two stored: the hand-off names the two it holds.
  rig.conn->release_lookup(hit.lease);
  rig.conn->lookup(rig.keys(1, 0, 4));
  auto partial = rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); }).lookups[0];
  REQUIRE(partial.hit.tokens == 128);
  const std::vector<std::byte> bytes = rig.conn->export_lease(partial.lease);
  const auto handoff = proto::decode_lease_handoff(bytes);
  REQUIRE(handoff);
  REQUIRE(handoff->keys == rig.keys(1, 0, 2));
  // An adopter of it gets the two chunks (a hand-off of four would be refused as another lease's).
  connector::Connector adopter(remote(srv));
  kvstrand::Finished f = adopt_in(adopter, rig.layout, bytes);
  REQUIRE(f.lookups[0].hit.tokens == 128);

  // A load that names its lookup's lease ends it: it cannot be exported or named again.
  rig.conn->lookup(rig.keys(1, 0, 2));
  auto looked = rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); }).lookups[0];
  REQUIRE(looked.lease != 0);
  auto load = rig.load_spec("b", 1, 0, 2, Rig::block_range(30, 8), 4);
  load.tier_lease = looked.lease;
  rig.conn->load(load);
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); }).loads[0].ok);
  try {
    rig.conn->export_lease(looked.lease);
    FAIL("a lease a load named was exported");
  } catch (const TransferRefused& e) {
    REQUIRE(e.code() == TransferErrc::bad_spec);
  }
}

TEST_CASE("node tier: a release that could not be sent while disconnected is sent on reconnecting to the same server",
          "[server][reactor][fault]") {
  WrongReplyServer srv(WrongReplyServer::offsets_past(0));  // answers lookups with lease 9
  connector::ConnectorOptions o;
  o.server_socket = srv.socket_path();
  o.server_request_timeout = 2s;
  Rig rig(o);
  rig.conn->lookup(rig.keys(1, 0, 2));
  const auto looked = rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); }).lookups[0];
  REQUIRE(looked.lease == 9);
  srv.hold_accepts(true);  // the client's next connection waits for its hello reply
  srv.drop();
  std::this_thread::sleep_for(300ms);  // the client sees its connection end, and tries again
  rig.conn->release_lookup(looked.lease);  // cannot be sent now
  std::this_thread::sleep_for(100ms);
  REQUIRE(srv.releases() == 0);
  // The client's attempt reaches the same server (the same arena): the
  // server may still hold lease 9, so it is released there.
  srv.hold_accepts(false);
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (srv.releases() == 0 && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(10ms);
  REQUIRE(srv.releases() >= 1);
  REQUIRE(srv.last_released() == 9);
}

TEST_CASE("node tier: an exported lease is the adopter's alone: the exporter's close leaves it held", "[server][reactor]") {
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  auto exporter = std::make_unique<Rig>(remote(srv));
  const auto looked = save_and_look_up(*exporter, Rig::block_range(0, 8));
  REQUIRE(looked.lease != 0);
  const std::vector<std::byte> bytes = exporter->conn->export_lease(looked.lease);
  connector::Connector adopter(remote(srv));
  kvstrand::Finished f = adopt_in(adopter, exporter->layout, bytes);
  REQUIRE(f.lookups[0].hit.tokens == 128);
  REQUIRE(stats(srv.socket_path()).leases == 1);
  // The exporter gave the lease away: its close releases the leases it
  // still holds, and this is not one of them (a release names a hold by
  // id, whoever holds it now).
  exporter.reset();
  REQUIRE(stats(srv.socket_path()).leases == 1);
  REQUIRE(stats(srv.socket_path()).pinned == 2);
  adopter.release_lookup(f.lookups[0].lease);
  eventually([&] { return stats(srv.socket_path()).leases == 0; }, "the adopter's release ended the lease");
}
