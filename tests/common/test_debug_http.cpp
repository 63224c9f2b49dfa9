// The read-only HTTP debug endpoint, with real clients: curl against a
// Connector, kvstrand-server and the running example engine; promtool on
// /metrics; slow, malformed and surplus connections while transfers run;
// the /debug page in headless Chromium (a screenshot is left next to this
// binary: debug-page.png).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <thread>
#include <fstream>

#include <kvstrand/version.hpp>

#include "connector_rig.hpp"
#include "common/debug_page.hpp"
#include "common/metrics.hpp"
#include "curl.hpp"
#include "process.hpp"
#include "server_process.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;

namespace {

int tcp_connect(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

connector::ConnectorOptions with_http(std::chrono::milliseconds deadline = 60s) {
  connector::ConnectorOptions o;
  o.http = common::HttpOptions{};
  o.transfer_deadline = deadline;
  return o;
}

template <class Pred>
void eventually(Pred p, std::chrono::seconds within = 10s) {
  const auto end = std::chrono::steady_clock::now() + within;
  while (!p()) {
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(20ms);
  }
}

// A Connector of kvstrand-server `srv`'s.
connector::ConnectorOptions on_server(const ServerProcess& srv) {
  connector::ConnectorOptions o;
  o.server_socket = srv.socket_path();
  return o;
}

}  // namespace

TEST_CASE("debug http: a gauge of bytes is printed whole, a fraction in full", "[http]") {
  common::PromText p;
  p.gauge("kvstrand_test_bytes", "Bytes", 8589934592.0);  // 8 GiB
  p.gauge("kvstrand_test_big", "Bytes", 107374182401.0);  // 100 GiB and a byte
  p.gauge("kvstrand_test_ratio", "A ratio", 0.1);
  const std::string& text = p.str();
  CHECK(text.find("kvstrand_test_bytes 8589934592\n") != std::string::npos);
  CHECK(text.find("kvstrand_test_big 107374182401\n") != std::string::npos);
  CHECK(text.find("kvstrand_test_ratio 0.1\n") != std::string::npos);
}

TEST_CASE("debug http: a connector's endpoints answer curl, promtool accepts /metrics", "[http][reactor][gpu]") {
  if (!device_present() || !curl_present()) return;
  Rig rig(with_http());
  const auto port = rig.conn->http_port();
  REQUIRE(port != 0);
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);
  rig.conn->lookup(rig.keys(1, 0, 3));
  rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); });

  auto g = curl(port, "/healthz");
  REQUIRE(g.code == 200);
  REQUIRE(g.body == "ok\n");
  g = curl(port, "/debug/transfers");
  REQUIRE(g.code == 200);
  REQUIRE(boost::json::parse(g.body).is_array());
  g = curl(port, "/debug/events");
  REQUIRE(g.code == 200);
  REQUIRE(boost::json::parse(g.body).as_object().contains("created_since_start"));
  g = curl(port, "/debug/tier");
  REQUIRE(g.code == 200);
  const auto tier = boost::json::parse(g.body).as_object();
  REQUIRE(tier.at("kind").as_string() == "local");
  REQUIRE(tier.at("objects").to_number<int>() == 2);
  REQUIRE(tier.at("lookups_by_result").as_object().at("partial").to_number<int>() == 1);
  REQUIRE(tier.at("transfers_by_outcome").as_object().at("save/ok").to_number<int>() == 1);
  g = curl(port, "/metrics");
  REQUIRE(g.code == 200);
  REQUIRE(g.body.find("kvstrand_transfers_total{kind=\"save\",outcome=\"ok\"} 1\n") != std::string::npos);
  REQUIRE(g.body.find("kvstrand_lookups_total{result=\"partial\"} 1\n") != std::string::npos);
  const std::string saved = "kvstrand_transfer_bytes_total{kind=\"save\"} ";
  const auto at = g.body.find(saved);
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(g.body.substr(at + saved.size())) > 0);
  REQUIRE(g.body.find("kvstrand_save_seconds_count 1\n") != std::string::npos);
  REQUIRE(g.body.find("kvstrand_step_call_seconds_bucket{le=\"+Inf\"}") != std::string::npos);
  REQUIRE(g.body.find("kvstrand_build_info{version=\"" KVSTRAND_VERSION_STRING "\",backend=\"") != std::string::npos);
  if (have("/usr/bin/promtool")) {
    REQUIRE(promtool_check(g.body).empty());
  } else {
    WARN("skipped promtool: /usr/bin/promtool missing (scripts/bootstrap.sh --test installs it)");
  }
  g = curl(port, "/debug");
  REQUIRE(g.code == 200);
  REQUIRE(g.body.find("/debug/transfers") != std::string::npos);
  // The first view is rendered on the server: state without running a script.
  REQUIRE(g.body.find("<span id=\"health\" class=\"ok\">ok</span>") != std::string::npos);
  REQUIRE(g.body.find("<tr><th>objects</th><td>2</td></tr>") != std::string::npos);
  // Read-only, and unknown paths list what exists.
  REQUIRE(curl(port, "/healthz", "POST").code == 405);
  g = curl(port, "/nope");
  REQUIRE(g.code == 404);
  REQUIRE(g.body.find("/metrics") != std::string::npos);
}

TEST_CASE("debug http: a transfer in flight shows in /debug/transfers, a fail-stop turns /healthz 503",
          "[http][reactor][sim][fault]") {
  if (!sim_hooks_present() || !curl_present()) return;
  Rig rig(with_http(300ms));
  const auto port = rig.conn->http_port();
  require_ok(device::sim::hold_stream(rig.save_stream()));
  rig.conn->save(rig.save_spec("stuck", 1, 0, 1, Rig::block_range(0, 4)));
  Got g;
  eventually([&] {
    g = curl(port, "/debug/transfers");
    return g.body.find("\"stuck\"") != std::string::npos;
  });
  const auto live = boost::json::parse(g.body).as_array().at(0).as_object();
  REQUIRE(live.at("kind").as_string() == "save");
  REQUIRE(live.at("tier").as_string() == "local");
  REQUIRE(live.at("bytes").to_number<std::uint64_t>() == 4 * 3 * Rig::kPlaneBlockBytes + 512);
  eventually([&] { return curl(port, "/healthz").code == 503; });  // its deadline passed
  g = curl(port, "/healthz");
  REQUIRE(g.body.find("deadline") != std::string::npos);
  REQUIRE(curl(port, "/metrics").body.find("kvstrand_fail_stops_total 1\n") != std::string::npos);
  // Past its deadline and still not seen to end: still listed, as such.
  REQUIRE(boost::json::parse(curl(port, "/debug/transfers").body).as_array().at(0).at("past_deadline").as_bool());
  require_ok(device::sim::release_stream(rig.save_stream()));
}

TEST_CASE("debug http: a non-loopback address is refused unless allowed, naming the option", "[http]") {
  common::HttpOptions o;
  o.address = "0.0.0.0";
  auto e = common::validate(o);
  REQUIRE(e.has_value());
  REQUIRE(e->option == "http.allow_non_loopback");
  o.allow_non_loopback = true;
  REQUIRE_FALSE(common::validate(o).has_value());
  o.address = "localhost-ish";
  REQUIRE(common::validate(o)->option == "http.address");
  connector::ConnectorOptions c;
  c.http = common::HttpOptions{};
  c.http->address = "10.1.2.3";
  try {
    connector::Connector conn(c);
    FAIL("a non-loopback endpoint was accepted");
  } catch (const std::invalid_argument& err) {
    REQUIRE(std::string(err.what()).find("http.allow_non_loopback") != std::string::npos);
  }
  REQUIRE(common::parse_http_address("127.0.0.1:9400")->port == 9400);
  REQUIRE_FALSE(common::parse_http_address("127.0.0.1").has_value());
  REQUIRE_FALSE(common::parse_http_address("127.0.0.1:99999").has_value());
}

TEST_CASE("debug http: slow, malformed and surplus clients cannot stall transfers", "[http][reactor][fault][gpu]") {
  if (!device_present() || !curl_present()) return;
  auto opts = with_http();
  opts.http->max_connections = 16;
  opts.http->request_timeout = 3s;
  Rig rig(opts);
  const auto port = rig.conn->http_port();
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) fds.push_back(tcp_connect(port));  // connect and say nothing
  for (int i = 0; i < 5; ++i) {                                     // half a request line, then silence
    fds.push_back(tcp_connect(port));
    REQUIRE(::send(fds.back(), "GET /metr", 9, MSG_NOSIGNAL) == 9);
  }
  const int huge = tcp_connect(port);  // a header far over the limit
  const std::string big = "GET /healthz HTTP/1.1\r\nX-Junk: " + std::string(64 * 1024, 'x') + "\r\n\r\n";
  (void)::send(huge, big.data(), big.size(), MSG_NOSIGNAL);
  std::vector<int> surplus;
  for (int i = 0; i < 20; ++i) surplus.push_back(tcp_connect(port));  // past max_connections: each takes an old one's place

  // Transfers run to completion meanwhile: 40 save-and-load round trips.
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 40; ++i) {
    const std::string req = "r" + std::to_string(i);
    rig.conn->save(rig.save_spec(req, 100 + i, 0, 1, Rig::block_range(0, 4)));
    REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);
    rig.conn->load(rig.load_spec(req, 100 + i, 0, 1, Rig::block_range(8, 4), 3));
    REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); }).loads[0].ok);
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  INFO("40 round trips with 36 bad clients connected: " << ms << " ms");
  std::string reply(256, '\0');
  const ssize_t n = ::recv(huge, reply.data(), reply.size(), 0);
  if (n > 0) REQUIRE(reply.find("431") != std::string::npos);  // refused with a status (or made room), not a crash
  auto eof_within = [](int fd, int ms) {
    pollfd p{fd, POLLIN, 0};
    char c;
    return ::poll(&p, 1, ms) == 1 && ::recv(fd, &c, 1, 0) <= 0;
  };
  // The oldest silent connections made room for the surplus: closed at once,
  // nothing read or written.
  int closed = 0;
  for (int fd : fds) closed += eof_within(fd, 2000);
  REQUIRE(closed == static_cast<int>(fds.size()));
  // And a probe gets in while every slot is taken by a silent one.
  REQUIRE(curl(port, "/healthz").code == 200);
  // Silent clients are dropped after request_timeout (3 s here) anyway.
  for (int fd : surplus) REQUIRE(eof_within(fd, 6000));
  for (int fd : fds) ::close(fd);
  for (int fd : surplus) ::close(fd);
  ::close(huge);
  eventually([&] { return curl(port, "/healthz").code == 200; });  // and still serving
}

// The /debug page as headless Chromium leaves it after its scripts ran
// (five seconds of virtual time): the DOM, or with `screenshot` a PNG there.
ProcessResult chromium_page(const std::string& url, const std::string& screenshot = {}) {
  const std::string profile = std::filesystem::temp_directory_path() / ("kvstrand-chromium-" + std::to_string(::getpid()));
  std::vector<std::string> args = {"/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
                                   "--no-first-run", "--user-data-dir=" + profile, "--enable-logging=stderr",
                                   "--v=0", "--virtual-time-budget=5000", "--window-size=1280,1100"};
  args.push_back(screenshot.empty() ? std::string("--dump-dom") : "--screenshot=" + screenshot);
  args.push_back(url);
  auto r = run_process(args);
  std::filesystem::remove_all(profile);
  return r;
}

TEST_CASE("debug http: /debug renders in headless Chromium with no console errors", "[http][reactor][gpu]") {
  if (!device_present()) return;
  if (!have("/usr/bin/chromium")) {
    WARN("skipped: /usr/bin/chromium missing (scripts/bootstrap.sh --test installs it)");
    return;
  }
  Rig rig(with_http());
  rig.conn->save(rig.save_spec("a", 1, 0, 1, Rig::block_range(0, 4)));
  rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
  const std::string url = "http://127.0.0.1:" + std::to_string(rig.conn->http_port()) + "/debug";
  const std::string shot = sibling_binary("debug-page.png");
  std::filesystem::remove(shot);
  auto r = chromium_page(url, shot);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(std::filesystem::exists(shot));
  REQUIRE(std::filesystem::file_size(shot) > 10'000);
  REQUIRE(r.output.find(":CONSOLE(") == std::string::npos);  // the page logged nothing: no errors
  r = chromium_page(url);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.output.find(":CONSOLE(") == std::string::npos);
  // The page's script ran and rendered the endpoints as tables.
  REQUIRE(r.output.find("created_since_start") != std::string::npos);
  REQUIRE(r.output.find("<span id=\"health\" class=\"ok\">ok</span>") != std::string::npos);
}

TEST_CASE("debug http: kvstrand-server --http serves sessions, holds, tier (ready vs configured) and metrics",
          "[http][server][gpu]") {
  if (!device_present() || !curl_present()) return;
  const auto port = free_port();
  ServerProcess srv({"--tier-bytes", "16M", "--chunk-tokens", "64", "--http", "127.0.0.1:" + std::to_string(port)});
  REQUIRE(srv.ready());
  Rig rig(on_server(srv));
  rig.conn->save(rig.save_spec("a", 1, 0, 2, Rig::block_range(0, 8)));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);
  rig.conn->lookup(rig.keys(1, 0, 2));  // takes a lease on the server
  rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); });

  eventually([&] { return curl(port, "/healthz").code == 200; });
  auto sessions = boost::json::parse(curl(port, "/debug/sessions").body).as_array();
  REQUIRE(sessions.size() == 1);
  REQUIRE(sessions[0].at("pid").to_number<int>() == ::getpid());
  REQUIRE(sessions[0].at("registrations").to_number<int>() == 1);
  auto holds = boost::json::parse(curl(port, "/debug/holds").body).as_array();
  REQUIRE(holds.size() == 1);
  REQUIRE(holds[0].at("kind").as_string() == "lease");
  REQUIRE(holds[0].at("pid").to_number<int>() == ::getpid());
  const auto tier = boost::json::parse(curl(port, "/debug/tier").body);
  REQUIRE(tier.at("objects").to_number<int>() == 2);
  REQUIRE(tier.at("configured_bytes").to_number<std::uint64_t>() == 16u << 20);
  REQUIRE(tier.at("ready_bytes").to_number<std::uint64_t>() <= 16u << 20);
  const auto metrics = curl(port, "/metrics").body;
  REQUIRE(metrics.find("kvstrand_server_requests_total{type=\"reserve\",status=\"ok\"} 1\n") != std::string::npos);
  REQUIRE(metrics.find("kvstrand_server_requests_total{type=\"commit\",status=\"ok\"} 1\n") != std::string::npos);
  REQUIRE(metrics.find("kvstrand_server_tier_ready_bytes ") != std::string::npos);
  REQUIRE(metrics.find("kvstrand_server_build_info{version=\"" KVSTRAND_VERSION_STRING "\",protocol=\"2.") !=
          std::string::npos);
  if (have("/usr/bin/promtool")) REQUIRE(promtool_check(metrics).empty());
  const std::string page = curl(port, "/debug").body;
  REQUIRE(page.find("/debug/sessions") != std::string::npos);
  REQUIRE(page.find("<tr><th>objects</th><td>2</td></tr>") != std::string::npos);  // rendered on the server
  REQUIRE(page.find("<th>pid</th>") != std::string::npos);
  // A refused flag names itself.
  auto r = run_process({sibling_binary("../kvstrand-server"), "--http", "0.0.0.0:9400"});
  REQUIRE(r.exit_code == 2);
  REQUIRE(r.output.find("--http") != std::string::npos);
}

TEST_CASE("debug http: kvstrand-server's /debug shows a person the hit rate and fill as percentages, sizes in KiB to "
          "GiB, and charts of the last minutes that move under load, in headless Chromium",
          "[http][server][gpu]") {
  if (!device_present() || !curl_present()) return;
  if (!have("/usr/bin/chromium")) {
    WARN("skipped: /usr/bin/chromium missing (scripts/bootstrap.sh --test installs it)");
    return;
  }
  const auto port = free_port();
  ServerProcess srv({"--tier-bytes", "16M", "--chunk-tokens", "64", "--http", "127.0.0.1:" + std::to_string(port)});
  REQUIRE(srv.ready());
  Rig rig(on_server(srv));
  // Load: each round saves a prompt's two chunks and looks up the prompt
  // before it, and this one with a chunk more than stored (a miss in the
  // hit rate). The history samples every two seconds as requests come.
  std::uint64_t seed = 1;
  const auto rounds = [&](int n) {
    for (int i = 0; i < n; ++i, ++seed) {
      rig.conn->save(rig.save_spec("a", seed, 0, 2, Rig::block_range(0, 8)));
      REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);
      for (const auto& keys : {rig.keys(seed - 1 == 0 ? seed : seed - 1, 0, 2), rig.keys(seed, 0, 3)}) {
        rig.conn->lookup(keys);
        const auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); });
        if (f.lookups[0].lease != 0) rig.conn->release_lookup(f.lookups[0].lease);
      }
      std::this_thread::sleep_for(700ms);
    }
  };
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/debug";
  const auto polylines = [](const std::string& dom) {
    std::vector<std::string> out;
    for (std::size_t at = dom.find("<polyline points=\""); at != std::string::npos;
         at = dom.find("<polyline points=\"", at + 1))
      out.push_back(dom.substr(at, dom.find('>', at) - at));
    return out;
  };
  rounds(8);
  auto first = chromium_page(url);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  REQUIRE(first.output.find(":CONSOLE(") == std::string::npos);  // the page's scripts logged no error
  // The headline: a hit rate in percent over the window, the fill in percent of a size in MiB.
  const auto head = first.output.find("id=\"headline\">hit rate ");
  REQUIRE(head != std::string::npos);
  const std::string headline = first.output.substr(head, first.output.find("</p>", head) - head);
  INFO(headline);
  REQUIRE(std::isdigit(static_cast<unsigned char>(headline[std::string("id=\"headline\">hit rate ").size()])));
  REQUIRE(headline.find(" % over the last ") != std::string::npos);
  REQUIRE(headline.find(" of 16 MiB)") != std::string::npos);
  // The levels side by side, and the tables' sizes as a person reads them.
  REQUIRE(first.output.find("<figcaption>levels</figcaption>") != std::string::npos);
  REQUIRE(first.output.find("<th>health</th><td>ok</td>") != std::string::npos);  // the arena whole, no error
  REQUIRE(first.output.find("<th>configured_bytes</th><td>16 MiB</td>") != std::string::npos);
  const auto before = polylines(first.output);
  REQUIRE(before.size() == 5);  // hit rate, loads, saves, evictions, fill
  REQUIRE(before[1].find(',') != std::string::npos);  // loads drawn: at least one point
  rounds(5);
  const auto second = chromium_page(url, sibling_binary("debug-page-server.png"));
  REQUIRE(second.exit_code == 0);
  const auto again = chromium_page(url);
  REQUIRE(again.exit_code == 0);
  const auto after = polylines(again.output);
  REQUIRE(after.size() == 5);
  // The charts moved: more points, drawn from the server's history.
  REQUIRE(after[1] != before[1]);
  REQUIRE(std::count(after[1].begin(), after[1].end(), ',') > std::count(before[1].begin(), before[1].end(), ','));
}

TEST_CASE("debug http: the running example engine answers on its endpoint", "[http][engine][gpu]") {
  if (!device_present() || !curl_present()) return;
  const auto port = free_port();
  ChildProcess demo({sibling_binary("../examples/engine/kvstrand-engine-demo"), "--arms", "tier", "--prompts", "32", "--pool-blocks", "300",
                     "--seconds", "60", "--time-scale", "0.5", "--bytes-scale", "64", "--out",
                     std::filesystem::temp_directory_path() / "kvstrand-demo-http", "--http",
                     "127.0.0.1:" + std::to_string(port)});
  INFO(demo.output());
  REQUIRE(demo.wait_for_output("debug endpoint on http://127.0.0.1:" + std::to_string(port), 60s));
  REQUIRE(curl(port, "/healthz").code == 200);
  eventually(
      [&] {  // the engine is saving and loading (after its warm-up pass: slow under the sanitizers)
        return curl(port, "/metrics").body.find("kvstrand_transfers_total{kind=\"load\",outcome=\"ok\"}") !=
               std::string::npos;
      },
      90s);
  REQUIRE(boost::json::parse(curl(port, "/debug/transfers").body).is_array());
  REQUIRE(boost::json::parse(curl(port, "/debug/tier").body).at("kind").as_string() == "local");
  demo.signal(SIGKILL);
}

TEST_CASE("debug page: numbers are written as integers or with at most two decimals", "[http]") {
  REQUIRE(common::page_number(3.0) == "3");
  REQUIRE(common::page_number(0.5) == "0.5");
  REQUIRE(common::page_number(1.7777777777777777) == "1.78");
  REQUIRE(common::page_number(21715.733079) == "21715.73");
  REQUIRE(common::page_number(-2.25) == "-2.25");
}

TEST_CASE("debug page: sizes are written in B to TiB, with at most three significant digits", "[http]") {
  REQUIRE(common::page_bytes(0) == "0 B");
  REQUIRE(common::page_bytes(512) == "512 B");
  REQUIRE(common::page_bytes(1023) == "1023 B");
  REQUIRE(common::page_bytes(1024) == "1 KiB");
  REQUIRE(common::page_bytes(1536) == "1.5 KiB");
  REQUIRE(common::page_bytes(100 * 1024) == "100 KiB");
  REQUIRE(common::page_bytes(16u << 20) == "16 MiB");
  REQUIRE(common::page_bytes(1.25 * (1u << 30)) == "1.25 GiB");
  REQUIRE(common::page_bytes(40.0 * (1ull << 40)) == "40 TiB");
  REQUIRE(common::page_bytes(3000.0 * (1ull << 40)) == "3000 TiB");
}

TEST_CASE("debug http: connections that never finish a header cannot keep kvstrand-server's probes out",
          "[http][server][fault]") {
  if (!curl_present()) return;
  // 64 connections (the default bound) that send half a header and renew
  // it failed /healthz and /readyz for as long as they were kept up, and a
  // supervisor restarted a healthy server.
  const auto port = free_port();
  ServerProcess srv({"--tier-bytes", "16M", "--chunk-tokens", "64", "--http", "127.0.0.1:" + std::to_string(port)});
  REQUIRE(srv.ready());
  eventually([&] { return curl(port, "/healthz").code == 200; });
  const std::string half = "GET /healthz HTTP/1.1\r\nX-Slow: ";  // a header, never finished
  std::vector<int> slow;
  for (int i = 0; i < 64; ++i) {
    slow.push_back(tcp_connect(port));
    REQUIRE(slow.back() >= 0);
    REQUIRE(::send(slow.back(), half.data(), half.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(half.size()));
  }
  std::this_thread::sleep_for(200ms);  // every one accepted and waiting
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    REQUIRE(curl(port, "/healthz").code == 200);
    REQUIRE(curl(port, "/readyz").code == 200);
    for (int& fd : slow) {  // renewed: the evicted ones come back
      pollfd p{fd, POLLIN, 0};
      char c;
      if (::poll(&p, 1, 0) == 1 && ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0) {
        ::close(fd);
        fd = tcp_connect(port);
        (void)::send(fd, half.data(), half.size(), MSG_NOSIGNAL);
      } else {
        (void)::send(fd, "x", 1, MSG_NOSIGNAL);
      }
    }
  }
  // A header dribbled a byte at a time still ends at the request bound (2 s).
  const int drip = slow.front();
  const auto t0 = std::chrono::steady_clock::now();
  pollfd p{drip, POLLIN, 0};
  char c;
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() - t0 < 10s) {
    (void)::send(drip, "y", 1, MSG_NOSIGNAL);
    closed = ::poll(&p, 1, 200) == 1 && ::recv(drip, &c, 1, MSG_DONTWAIT) <= 0;
  }
  REQUIRE(closed);
  for (int fd : slow) ::close(fd);
}

TEST_CASE("debug http: with --http-token-file every page but the probes needs the token", "[http][server][tenants]") {
  if (!curl_present()) return;
  // The pages show client pids, holds and namespaces, and loopback is open
  // to every local user.
  const std::string file = ServerProcess::fresh_socket_path() + ".token";
  {
    std::ofstream(file) << "s3cret-token\n";
  }
  ::chmod(file.c_str(), 0600);
  const auto port = free_port();
  ServerProcess srv({"--tier-bytes", "16M", "--chunk-tokens", "64", "--http", "127.0.0.1:" + std::to_string(port),
                     "--http-token-file", file});
  REQUIRE(srv.ready());
  eventually([&] { return curl(port, "/healthz").code == 200; });
  REQUIRE(curl(port, "/readyz").code != 401);
  for (const std::string path : {"/metrics", "/debug", "/debug/tier", "/debug/holds", "/debug/sessions"}) {
    INFO(path);
    REQUIRE(curl(port, path).code == 401);
    REQUIRE(curl(port, path, "GET", "Authorization: Bearer wrong-token!").code == 401);
    REQUIRE(curl(port, path, "GET", "Authorization: Bearer s3cret-token").code == 200);
  }
  // A token file others can read is refused at start, naming the flag.
  ::chmod(file.c_str(), 0644);
  auto r = run_process({sibling_binary("../kvstrand-server"), "--http", "127.0.0.1:0", "--http-token-file", file});
  REQUIRE(r.exit_code == 2);
  REQUIRE(r.output.find("--http-token-file") != std::string::npos);
  ::unlink(file.c_str());
}
