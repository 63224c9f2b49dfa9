// kvstrand-server as a real process with several client processes
// (kvstrand-tier-client): holds that live exactly as long as their process
// (SIGKILL, SIGSTOP, a closed connection, a forked child), leases looked up
// in one process and loaded or adopted in another, and four clients
// verifying each other's bytes (F22, F24).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <filesystem>
#include <cstring>

#include "common/parse_bytes.hpp"
#include "curl.hpp"
#include "protocol_session.hpp"
#include "support.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace kvstrand::proto;
using namespace std::chrono_literals;

TEST_CASE("server: a closed connection leaves its process's holds, another session releases them",
          "[server][fault]") {
  ServerProcess srv(kFlags);
  REQUIRE(srv.ready());
  std::uint64_t lease = 0, reservation = 0;
  {
    Client c(srv.socket_path());
    const auto reg = open_session(c);
    eventually([&] { return stats(srv.socket_path()).ready_bytes > 0; }, "a slab ready");
    REQUIRE(must_call(c, Commit{reserve(c, reg, keys(1, 2)).reservation, true}).status == Status::ok);
    lease = lookup(c, reg, keys(1, 2)).lease;
    reservation = reserve(c, reg, keys(2, 1)).reservation;
  }  // closed while this process lives: a copy of it could still be running
  std::this_thread::sleep_for(200ms);
  auto s = stats(srv.socket_path());
  REQUIRE(s.leases == 1);
  REQUIRE(s.reservations == 1);
  Client c(srv.socket_path());
  REQUIRE(must_call(c, Hello{kMajor, kMinor, "later", {}}).status == Status::ok);
  REQUIRE(must_call(c, Release{lease}).status == Status::ok);
  REQUIRE(must_call(c, Release{reservation}).status == Status::ok);
  s = stats(srv.socket_path());
  REQUIRE(s.leases == 0);
  REQUIRE(s.reservations == 0);
}

TEST_CASE("server: a connection outlives its process only to be closed: a forked child can hold nothing on it",
          "[server][fault]") {
  // P says hello, registers, stores a chunk and forks C; P exits; C then asks
  // for a reservation and a lease on the socket it inherited. Such holds
  // would belong to no live process and never be freed.
  ServerProcess srv(kFlags);
  REQUIRE(srv.ready());
  eventually([&] { return stats(srv.socket_path()).ready_bytes > 0; }, "a slab ready");
  int result[2];
  REQUIRE(::pipe(result) == 0);
  const pid_t p = ::fork();
  REQUIRE(p >= 0);
  if (p == 0) {  // P: no Catch2 macro here, only exit codes
    ::close(result[0]);
    Client c(srv.socket_path());
    int arena = -1;
    const auto hello = c.hello(&arena);
    if (arena >= 0) ::close(arena);
    const auto r = c.call(RegisterLayout{layout()});
    if (!hello || hello->status != Status::ok || !r || r->status != Status::ok) ::_exit(10);
    const std::uint32_t reg = std::get<RegisterReply>(r->payload).registration;
    const auto stored = c.call(Reserve{reg, keys(1, 1), {1}});
    if (!stored || stored->status != Status::ok) ::_exit(11);
    const auto committed = c.call(Commit{std::get<ReserveReply>(stored->payload).reservation, true});
    if (!committed || committed->status != Status::ok) ::_exit(12);
    const pid_t self = ::getpid();
    if (::fork() == 0) {  // C
      while (::getppid() == self) ::usleep(1000);  // until P has exited
      ::usleep(300'000);                          // and its server has seen it
      char made = 0;
      const auto res = c.call(Reserve{reg, keys(2, 1), {1}});
      if (res && res->status == Status::ok && std::get<ReserveReply>(res->payload).reservation != 0) made |= 1;
      const auto look = c.call(Lookup{reg, keys(1, 1)});
      if (look && look->status == Status::ok && std::get<LookupReply>(look->payload).lease != 0) made |= 2;
      if (::write(result[1], &made, 1) != 1) ::_exit(1);
      ::_exit(0);
    }
    ::_exit(0);
  }
  ::close(result[1]);
  int status = 0;
  REQUIRE(::waitpid(p, &status, 0) == p);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  pollfd pf{result[0], POLLIN, 0};
  char made = -1;
  REQUIRE(::poll(&pf, 1, 20000) == 1);
  REQUIRE(::read(result[0], &made, 1) == 1);
  REQUIRE(::poll(&pf, 1, 20000) == 1);  // EOF: C has exited
  char after = 0;
  REQUIRE(::read(result[0], &after, 1) == 0);
  ::close(result[0]);
  CHECK(made == 0);  // neither a reservation nor a lease was granted
  const StatsReply st = stats(srv.socket_path());
  CHECK(st.reservations == 0);
  CHECK(st.leases == 0);
  CHECK(st.pinned == 0);
}

TEST_CASE("server: a client SIGKILLed holding a lease loses it at once (F24)", "[server][fault][gpu]") {
  if (!device_present()) return;
  ServerProcess srv(kFlags);
  REQUIRE(srv.ready());
  ChildProcess client({sibling_binary("kvstrand-tier-client"), "--socket", srv.socket_path(), "--hold"});
  REQUIRE(client.wait_for_output("holding", 20s));
  REQUIRE(stats(srv.socket_path()).leases == 1);
  client.signal(SIGKILL);
  client.wait();
  eventually([&] { return stats(srv.socket_path()).leases == 0; }, "the lease freed when its process exited");
  REQUIRE(stats(srv.socket_path()).pinned == 0);
}

TEST_CASE("server: a lease looked up in one process is loaded byte for byte in another, then freed",
          "[server][gpu]") {
  if (!device_present()) return;
  ServerProcess srv(kFlags);
  REQUIRE(srv.ready());
  const std::string file = srv.socket_path() + ".lease";
  ChildProcess scheduler({sibling_binary("kvstrand-tier-client"), "--socket", srv.socket_path(), "--export-lease", file});
  REQUIRE(scheduler.wait_for_output("exported", 20s));
  auto s = stats(srv.socket_path());
  REQUIRE(s.leases == 1);
  REQUIRE(s.pinned == 4);  // pinned while the handoff travels
  auto worker = run_process({sibling_binary("kvstrand-tier-client"), "--socket", srv.socket_path(), "--adopt-lease", file});
  INFO(worker.output);
  REQUIRE(worker.exit_code == 0);
  REQUIRE(worker.output.find("adopted load: exact") != std::string::npos);
  s = stats(srv.socket_path());
  REQUIRE(s.leases == 0);  // the load ended it, though its exporter still runs
  REQUIRE(s.pinned == 0);
  // The same bytes again: that lease is gone, a miss (recompute), never another's.
  auto again = run_process({sibling_binary("kvstrand-tier-client"), "--socket", srv.socket_path(), "--adopt-lease", file});
  INFO(again.output);
  REQUIRE(again.exit_code == 3);
  REQUIRE(again.output.find("adopt: miss") != std::string::npos);
  std::filesystem::remove(file);
}

TEST_CASE("server: a handed-off lease is freed when its exporter dies first, or its adopter", "[server][fault][gpu]") {
  if (!device_present()) return;
  ServerProcess srv(kFlags);
  REQUIRE(srv.ready());
  const std::string file = srv.socket_path() + ".lease";
  {  // the exporter dies before anyone adopts: freed with it; adopting it later is a miss
    ChildProcess scheduler(
        {sibling_binary("kvstrand-tier-client"), "--socket", srv.socket_path(), "--export-lease", file});
    REQUIRE(scheduler.wait_for_output("exported", 20s));
    REQUIRE(stats(srv.socket_path()).leases == 1);
    scheduler.signal(SIGKILL);
    scheduler.wait();
    eventually([&] { return stats(srv.socket_path()).leases == 0; }, "the exporter's lease freed at its exit");
    auto late = run_process({sibling_binary("kvstrand-tier-client"), "--socket", srv.socket_path(), "--adopt-lease", file});
    INFO(late.output);
    REQUIRE(late.exit_code == 3);
    std::filesystem::remove(file);
  }
  {  // adopted, then the exporter dies: the adopter keeps it; the adopter dies: freed
    ChildProcess scheduler(
        {sibling_binary("kvstrand-tier-client"), "--socket", srv.socket_path(), "--export-lease", file});
    REQUIRE(scheduler.wait_for_output("exported", 20s));
    ChildProcess worker(
        {sibling_binary("kvstrand-tier-client"), "--socket", srv.socket_path(), "--adopt-lease", file, "--then-hold"});
    REQUIRE(worker.wait_for_output("adopted", 20s));
    // A second adopter of the same bytes gets a miss, not the worker's lease.
    auto second = run_process(
        {sibling_binary("kvstrand-tier-client"), "--socket", srv.socket_path(), "--adopt-lease", file});
    INFO(second.output);
    REQUIRE(second.exit_code == 3);
    const auto sessions = stats(srv.socket_path()).sessions;
    scheduler.signal(SIGKILL);
    scheduler.wait();
    eventually([&] { return stats(srv.socket_path()).sessions < sessions; }, "the exporter's session ended");
    auto s = stats(srv.socket_path());
    REQUIRE(s.leases == 1);  // the adopter's now
    REQUIRE(s.pinned == 4);
    worker.signal(SIGKILL);
    worker.wait();
    eventually([&] { return stats(srv.socket_path()).leases == 0; }, "the adopter's lease freed at its exit");
    REQUIRE(stats(srv.socket_path()).pinned == 0);
    std::filesystem::remove(file);
  }
}

TEST_CASE("server: a client SIGKILLed between reserve and commit: nothing readable, its space comes back",
          "[server][fault][sim]") {
  if (!device_present() || !sim_hooks_present()) return;
  // Room for exactly the 4 chunks the client reserves.
  ServerProcess srv({"--tier-bytes", "2M", "--slab-bytes", "2M", "--chunk-tokens", "64"});
  REQUIRE(srv.ready());
  ChildProcess client({sibling_binary("kvstrand-tier-client"), "--socket", srv.socket_path(), "--stall-save"});
  REQUIRE(client.wait_for_output("reserved", 20s));
  auto s = stats(srv.socket_path());
  REQUIRE(s.reservations == 1);
  REQUIRE(s.objects == 0);
  client.signal(SIGKILL);
  client.wait();
  eventually([&] { return stats(srv.socket_path()).reservations == 0; }, "the reservation freed at exit");
  s = stats(srv.socket_path());
  REQUIRE(s.objects == 0);
  REQUIRE(s.used_bytes == 0);  // the space is back
}

TEST_CASE("server: a client SIGSTOPped with a lease keeps it while the tier overfills, its load is exact",
          "[server][fault][gpu]") {
  if (!device_present()) return;
  // 124 objects: the filler's 100 prompts of 4 chunks overfill it three times over.
  ServerProcess srv({"--tier-bytes", "2M", "--slab-bytes", "2M", "--chunk-tokens", "64"});
  REQUIRE(srv.ready());
  ChildProcess holder(
      {sibling_binary("kvstrand-tier-client"), "--socket", srv.socket_path(), "--hold-then-load", "1"});
  REQUIRE(holder.wait_for_output("holding", 20s));
  holder.signal(SIGSTOP);  // returns once it is stopped
  auto fill = run_process({sibling_binary("kvstrand-tier-client"), "--socket", srv.socket_path(), "--fill", "100"});
  INFO(fill.output);
  REQUIRE(fill.exit_code == 0);
  REQUIRE(stats(srv.socket_path()).evictions > 250);  // the tier overfilled, the clock went round
  std::this_thread::sleep_for(1500ms);              // past the holder's own wait, had it run
  REQUIRE(stats(srv.socket_path()).leases == 1);    // no clock took it
  holder.signal(SIGCONT);
  auto r = holder.wait();
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.output.find("load after hold: exact") != std::string::npos);
}

TEST_CASE("server: four client processes store, look up and load each other's prompts byte for byte",
          "[server][gpu]") {
  if (!device_present()) return;
  ServerProcess srv({"--tier-bytes", "64M", "--slab-bytes", "8M", "--chunk-tokens", "64"});
  REQUIRE(srv.ready());
  constexpr int kClients = 4;
  std::vector<std::unique_ptr<ChildProcess>> clients;
  for (int i = 0; i < kClients; ++i)
    clients.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{sibling_binary("kvstrand-tier-client"), "--socket", srv.socket_path(), "--id",
                                 std::to_string(i), "--peers", std::to_string(kClients), "--rounds", "6"}));
  for (int i = 0; i < kClients; ++i) {
    const auto r = clients[i]->wait();
    INFO("client " << i << ": " << r.output);
    REQUIRE(r.exit_code == 0);
    REQUIRE(r.output.find("mismatches 0") != std::string::npos);
  }
  eventually([&] { return stats(srv.socket_path()).leases == 0; }, "every lease released");
}
