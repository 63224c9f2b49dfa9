// A node tier that survives its server: kvstrand-server SIGKILLed and
// restarted on a named arena (--arena-path), against the same run on a
// memfd arena (the default, emptied by a restart).
//
// Each arm: a server of --tier SIZE (default 4G) in slabs of 1G; a client
// (a Connector on this host's device 0) that has pinned the whole arena;
// the arena filled with reference objects (a 512-token prompt: 2 objects of
// 16 blocks and an image, 12.9 MB each) by reserve and commit until it
// evicts; the client's own prompt saved last, with its bytes. Then SIGKILL
// and a new server on the same socket (and path):
// - first answer: seconds from its spawn until a hello is answered;
// - served: seconds from its spawn until a lookup of every prompt filled has
//   been answered (the hits counted), and objects/s;
// - the client: milliseconds until its next lookup is answered (it
//   reconnects), whether it mapped the arena again, and until its prompt
//   loads byte for byte (named) or the arena is pinned again (memfd).
//
// usage: bench_restart [--tier SIZE] [--memfd-tier SIZE]
// (--memfd-tier, default --tier: a memfd arena's restart needs a second
// arena's memory while the client still maps the first, which a host sized
// for one arena cannot give.)
// The last line: "restart: named arena: N objects recovered, ...".
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "device/device.hpp"
#include "proto/protocol.hpp"
#include "reference_geometry.hpp"
#include "bench_server.hpp"
#include "wire.hpp"

using namespace kvstrand;
using namespace kvstrand::bench;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// kvstrand-server on a private socket, on `arena_path` when not empty.
struct Server : BenchServer {
  Server() : BenchServer("bench-restart") {}
  void spawn(const std::string& tier, const std::string& arena_path) {
    std::vector<std::string> flags = {"--tier-bytes", tier, "--slab-bytes", "1G", "--chunk-tokens", "256"};
    if (!arena_path.empty()) flags.insert(flags.end(), {"--arena-path", arena_path});
    BenchServer::spawn(flags);
  }
};

// Seconds from `t0` until the server at `socket` answers a hello.
double first_answer(const std::string& socket, Clock::time_point t0) {
  for (;;) {
    if (Wire w(socket); w.connected() && w.call(proto::Hello{proto::kMajor, proto::kMinor, "bench_restart"}))
      return seconds_since(t0);
    if (Clock::now() - t0 > 120s) die("the restarted server did not answer within 120 s");
    std::this_thread::sleep_for(200us);
  }
}

kvstrand::Finished wait_for(connector::Connector& c, bool lookups) {
  const auto t0 = Clock::now();
  for (;;) {
    auto f = c.finished();
    if (lookups ? !f.lookups.empty() : (!f.saves.empty() || !f.loads.empty())) return f;
    if (Clock::now() - t0 > 60s) die("no outcome within 60 s");
    std::this_thread::sleep_for(20us);
  }
}

struct Arm {
  std::uint64_t filled = 0, after = 0, served = 0;
  double first = 0, serve_s = 0, reconnect_ms = 0, then_ms = 0, pin_s = 0;
  std::uint64_t mapped = 0, kept = 0;
  bool exact = false;
};

Arm run_arm(const std::string& tier, bool named) {
  Arm a;
  const std::string path = named ? "/dev/shm/kvstrand-bench-restart-" + std::to_string(::getpid()) : "";
  if (named) ::unlink(path.c_str());
  Server srv;
  srv.spawn(tier, path);
  first_answer(srv.socket, Clock::now());
  {
    Wire w(srv.socket);
    while (w.open() != 0 && w.stats().ready_bytes < w.stats().capacity_bytes) std::this_thread::sleep_for(20ms);
  }
  const kv::Layout l = reference_layout();
  Pool pool(64);
  NodeClient client(srv.socket, pool, l);
  a.pin_s = client.wait_pinned(600s);
  // Fill: prompts reserved and committed (bookkeeping only) until the
  // arena evicts.
  std::vector<std::uint64_t> prompts;
  {
    Wire w(srv.socket);
    const std::uint32_t reg = w.open();
    if (reg == 0) die("the filler's registration was refused");
    for (std::uint64_t p = 1000;; ++p) {
      auto r = w.call(proto::Reserve{reg, prompt_keys(l, p), {0, 1}});
      if (!r) die("a reserve failed");
      const auto& rr = std::get<proto::ReserveReply>(r->payload);
      if (!w.call(proto::Commit{rr.reservation, true})) die("a commit failed");
      if (w.stats().evictions > 0) break;
      prompts.push_back(p);
    }
  }
  // The client's own prompt, with its bytes (one more eviction).
  std::vector<kv::BlockId> src(32), dst(32);
  for (kv::BlockId b = 0; b < 32; ++b) src[b] = b, dst[b] = 32 + b;
  client.conn->save(save_spec(l, 7, src));
  if (!wait_for(*client.conn, false).saves.at(0).ok) die("the client's save failed");
  prompts.erase(prompts.begin(), prompts.begin() + 2);  // what its save evicted, and a margin
  a.filled = 2 * prompts.size();

  srv.kill(SIGKILL);
  const auto t0 = Clock::now();
  srv.spawn(tier, path);
  a.first = first_answer(srv.socket, t0);
  {
    Wire w(srv.socket);
    const std::uint32_t reg = w.open();
    a.after = w.stats().objects;
    for (std::uint64_t p : prompts) {
      auto r = w.call(proto::Lookup{reg, prompt_keys(l, p)});
      if (!r) die("a lookup failed");
      const auto& lr = std::get<proto::LookupReply>(r->payload);
      a.served += lr.hit.tokens / 256;
      if (lr.lease != 0) w.call(proto::Release{lr.lease});
    }
    a.serve_s = seconds_since(t0);
  }
  // The client: its next lookup reconnects it.
  const auto c0 = Clock::now();
  std::uint32_t hit = 0;
  for (int attempt = 0; attempt < 50; ++attempt) {  // the first may meet the dead connection
    client.conn->lookup(prompt_keys(l, 7));
    const auto f = wait_for(*client.conn, true);
    hit = f.lookups.at(0).hit.tokens;
    if (f.lookups.at(0).lease != 0) client.conn->release_lookup(f.lookups.at(0).lease);
    if (client.conn->arena_mappings().reconnects > 0) break;
    std::this_thread::sleep_for(1ms);
  }
  a.reconnect_ms = seconds_since(c0) * 1e3;
  const auto m = client.conn->arena_mappings();
  a.mapped = m.mapped;
  a.kept = m.kept;
  const auto l0 = Clock::now();
  if (hit == 512) {
    kv::TransferSpec s = save_spec(l, 7, dst);
    s.request = "load-7";
    s.state_slots = {2};
    client.conn->load(s);
    a.exact = wait_for(*client.conn, false).loads.at(0).ok;
  } else {
    a.exact = client.wait_pinned(600s) >= 0;  // nothing to load: what the client pays instead
  }
  a.then_ms = seconds_since(l0) * 1e3;
  client.conn->close();
  if (named) {
    ::unlink(path.c_str());
    ::unlink((path + ".lock").c_str());
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tier = "4G", memfd_tier;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--tier" && i + 1 < argc) {
      tier = argv[++i];
    } else if (arg == "--memfd-tier" && i + 1 < argc) {
      memfd_tier = argv[++i];
    } else {
      std::fprintf(stderr, "usage: bench_restart [--tier SIZE] [--memfd-tier SIZE]\n");
      return 2;
    }
  }
  if (auto n = device::device_count(); !n.ok() || *n == 0)
    die("no device for the " + std::string(device::backend_name()) + " backend");
  std::printf("bench_restart: --tier-bytes %s in slabs of 1G, objects of %.1f MB (%s backend)\n", tier.c_str(),
              static_cast<double>(16 * kBlockBytes + kImageBytes) / 1e6, device::backend_name());
  std::fflush(stdout);
  Arm arms[2];
  for (int named = 1; named >= 0; --named) {
    Arm& a = arms[named];
    a = run_arm(named == 1 || memfd_tier.empty() ? tier : memfd_tier, named == 1);
    std::printf("%s: pinned %.2f s; filled %llu objects; SIGKILL, restart: first answer %.3f s, %llu objects "
                "there, %llu found by lookups %.3f s after the spawn (%.0f objects/s); the client reconnected in "
                "%.1f ms (arena mapped %llu times, kept %llu) and %s %.1f ms later\n",
                named ? ("named arena " + tier).c_str() : ("memfd arena " + (memfd_tier.empty() ? tier : memfd_tier)).c_str(), a.pin_s, static_cast<unsigned long long>(a.filled), a.first,
                static_cast<unsigned long long>(a.after), static_cast<unsigned long long>(a.served), a.serve_s,
                a.served / a.serve_s, a.reconnect_ms, static_cast<unsigned long long>(a.mapped),
                static_cast<unsigned long long>(a.kept), named ? (a.exact ? "loaded its prompt" : "FAILED its load")
                                                               : (a.exact ? "had pinned the new arena" : "FAILED to pin"),
                a.then_ms);
    std::fflush(stdout);
  }
  const Arm& n = arms[1];
  const Arm& m = arms[0];
  std::printf("restart: named arena: %llu of %llu objects recovered, first answer %.3f s, all served %.3f s "
              "(%.0f objects/s), client reconnect %.1f ms with %llu re-pins; memfd: %llu recovered, re-pin %.2f s\n",
              static_cast<unsigned long long>(n.served), static_cast<unsigned long long>(n.filled), n.first,
              n.serve_s, n.served / n.serve_s, n.reconnect_ms, static_cast<unsigned long long>(n.mapped - 1),
              static_cast<unsigned long long>(m.served), m.then_ms / 1e3);
  return n.exact && n.served == n.filled ? 0 : 1;
}
