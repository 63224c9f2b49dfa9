// The Connector over RemoteTier and a real kvstrand-server process: the same
// transfer path as LocalTier, and what happens when the server dies, stops
// or comes back (F14, F23 for the server, reconnect).
#include <signal.h>

#include "connector_rig.hpp"
#include "server_process.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using reactor::FailStop;
using reactor::TransferErrc;
using reactor::TransferRefused;

namespace {

reactor::ConnectorOptions remote(const ServerProcess& srv, std::chrono::milliseconds deadline = 60s) {
  reactor::ConnectorOptions o;
  o.server_socket = srv.socket_path();
  o.transfer_deadline = deadline;
  o.server_request_timeout = 2s;
  return o;
}

const std::vector<std::string> kServerFlags = {"--tier-bytes", "32M", "--chunk-tokens", "64"};

}  // namespace

TEST_CASE("remote: save, lookup, load through the server restore KV and state byte for byte", "[server][reactor][gpu]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(srv.ready());
  Rig rig(remote(srv));
  const auto src = std::vector<kv::BlockId>{5, 9, 2, 40, 41, 42, 43, 7, 8, 60, 61, 62};
  const auto before = rig.snapshot(src, {2});
  rig.conn->save(rig.save_spec("a", 1, 0, 3, src));
  auto f = rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); });
  INFO(f.saves[0].reason);
  REQUIRE(f.saves[0].ok);
  rig.conn->lookup(rig.keys(1, 0, 4));
  f = rig.wait_for([](const reactor::Finished& f) { return !f.lookups.empty(); });
  REQUIRE(f.lookups[0].hit.tokens == 192);
  REQUIRE(f.lookups[0].hit.checkpoints == std::vector<std::uint32_t>{64, 128, 192});
  rig.randomize(2);
  const auto dst = Rig::block_range(20, 12);
  rig.conn->load(rig.load_spec("a", 1, 0, 3, dst, 7));
  f = rig.wait_for([](const reactor::Finished& f) { return !f.loads.empty(); });
  INFO(f.loads[0].reason);
  REQUIRE(f.loads[0].ok);
  REQUIRE(rig.snapshot(dst, {7}) == before);
}

TEST_CASE("remote: no server at the socket is refused at registration, naming it", "[server][reactor]") {
  reactor::ConnectorOptions o;
  o.server_socket = "/tmp/kvstrand-no-such-server.sock";
  o.server_request_timeout = 1s;
  try {
    Rig rig(o);
    FAIL("registered without a server");
  } catch (const TransferRefused& e) {
    REQUIRE(e.code() == TransferErrc::tier_unavailable);
  }
}

TEST_CASE("remote: a server killed mid-transfer fails the load at once with its blocks", "[server][reactor][fault]") {
  if (!device_present()) return;
  auto srv = std::make_unique<ServerProcess>(kServerFlags);
  REQUIRE(srv->ready());
  Rig rig(remote(*srv));
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  REQUIRE(rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); }).saves[0].ok);

  srv->kill(SIGSTOP);  // the retrieve goes out and is never answered...
  const auto dst = Rig::block_range(20, 8);
  rig.conn->load(rig.load_spec("a", 1, 0, 2, dst, 3));
  std::this_thread::sleep_for(100ms);
  srv->kill(SIGKILL);  // ...until the server dies
  auto f = rig.wait_for([](const reactor::Finished& f) { return !f.loads.empty(); });
  REQUIRE_FALSE(f.loads[0].ok);
  REQUIRE(f.loads[0].error == TransferErrc::tier_unavailable);
  REQUIRE(f.loads[0].blocks == dst);  // recompute exactly these

  // The connector is not fail-stopped: the server's death proved its copies
  // ended. A later transfer fails cleanly while no server is there.
  rig.conn->save(rig.save_spec("b", 2, 0, 1, Rig::block_range(0, 4)));
  f = rig.wait_for([](const reactor::Finished& f) { return !f.saves.empty(); });
  REQUIRE_FALSE(f.saves[0].ok);
  REQUIRE(f.saves[0].error == TransferErrc::tier_unavailable);
}

TEST_CASE("remote: a stopped server is fail-stop at the transfer's deadline, never a hang", "[server][reactor][fault]") {
  if (!device_present()) return;
  ServerProcess srv(kServerFlags);
  REQUIRE(srv.ready());
  Rig rig(remote(srv, 300ms));
  srv.kill(SIGSTOP);
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  const auto end = std::chrono::steady_clock::now() + 10s;
  bool failed = false;
  while (!failed && std::chrono::steady_clock::now() < end) {
    try {
      rig.conn->finished();
      std::this_thread::sleep_for(5ms);
    } catch (const FailStop& e) {
      REQUIRE(e.code() == TransferErrc::deadline_exceeded);
      failed = true;
    }
  }
  REQUIRE(failed);
  srv.kill(SIGCONT);
}
