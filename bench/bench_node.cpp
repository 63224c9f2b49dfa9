// The node tier on a whole host: one kvstrand-server, one client process
// per GPU, each started with its own CUDA_VISIBLE_DEVICES (and
// HIP_VISIBLE_DEVICES) as engines start ranks.
//
// 1. Start: a server with a big --tier-bytes (--start-tier, default 100G):
//    seconds from its spawn until it answers a first client's hello, and
//    until every slab of the arena is ready (stats: ready == configured).
// 2. Scaling: for 1, 2, 4, 8 ... GPUs (up to --gpus), that many client
//    processes at once, client i on GPU i. Each registers its own pool of
//    the reference geometry and, in the same window, saves distinct 2-chunk
//    prompts (32 blocks + 2 images, 25.8 MB) with --in-flight saves
//    outstanding; then, in a second window, loads one of its prompts back
//    the same way. Aggregate GB/s = bytes of the transfers completed in the
//    window / window. The baseline is the 1-GPU row of the same run.
//
// usage: bench_node [--gpus N] [--seconds S] [--in-flight K] [--start-tier SIZE] [--scaling-tier SIZE]
// The last line: "node tier scaling: save N GPUs / 1 GPU = R, load ... = R".
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
#include "common/parse_bytes.hpp"
#include "proto/protocol.hpp"
#include "connector/connector.hpp"
#include "reference_geometry.hpp"
#include "bench_server.hpp"
#include "wire.hpp"

using namespace kvstrand;
using namespace kvstrand::bench;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

// A kvstrand-server of --tier-bytes `tier`.
struct Server : BenchServer {
  explicit Server(const std::string& tier) : BenchServer("bench-node") {
    spawn({"--tier-bytes", tier, "--slab-bytes", "1G", "--chunk-tokens", "256"});
  }
};

// The server's stats over a fresh connection (nullopt if the server is not
// there yet).
std::optional<proto::StatsReply> stats(const std::string& socket) {
  Wire w(socket);
  if (!w.connected() || !w.call(proto::Hello{proto::kMajor, proto::kMinor, "bench_node"})) return std::nullopt;
  auto r = w.call(proto::Stats{});
  if (!r) return std::nullopt;
  return std::get<proto::StatsReply>(r->payload);
}

void start_figures(const std::string& tier) {
  const auto t0 = Clock::now();
  Server srv(tier);
  std::optional<proto::StatsReply> s;
  while (!(s = stats(srv.socket))) {
    if (srv.exited()) {
      std::printf("start: --tier-bytes %s refused by the server (see its message above)\n", tier.c_str());
      return;
    }
    if (Clock::now() - t0 > 60s) die("the server did not answer within 60 s");
    std::this_thread::sleep_for(1ms);
  }
  const double first = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("start: --tier-bytes %s: first client answered %.3f s after spawn (ready then: %.1f of %.1f GiB)\n",
              tier.c_str(), first, static_cast<double>(s->ready_bytes) / (1ull << 30),
              static_cast<double>(s->capacity_bytes) / (1ull << 30));
  std::fflush(stdout);
  while (s->ready_bytes < s->capacity_bytes) {
    if (Clock::now() - t0 > 600s) die("the arena did not fill within 600 s");
    std::this_thread::sleep_for(20ms);
    if (auto n = stats(srv.socket)) s = n;
  }
  const double full = std::chrono::duration<double>(Clock::now() - t0).count();
  const double gib = static_cast<double>(s->capacity_bytes) / (1ull << 30);
  std::printf("start: full capacity (%.1f GiB) after %.2f s (%.3f s/GiB)\n", gib, full, full / gib);
  std::fflush(stdout);
  // A client's side: mapping the arena and pinning all of it for its GPU.
  const kv::Layout l = reference_layout();
  Pool pool(16);
  const auto c0 = Clock::now();
  NodeClient c(srv.socket, pool, l);
  const double attach = std::chrono::duration<double>(Clock::now() - c0).count();
  const double pinned = c.wait_pinned(600s);
  std::printf("start: a client attached in %.3f s and pinned the whole arena in %.2f s more (%.3f s/GiB, %u threads)\n",
              attach, pinned, pinned / gib, 4u);
  c.conn->close();
}

kvstrand::Finished wait_any(connector::Connector& c) {
  for (;;) {
    auto f = c.finished();
    if (!f.saves.empty() || !f.loads.empty()) return f;
    std::this_thread::sleep_for(20us);
  }
}

// A client process: saves for a window, then loads for a window; prints
// "SAVE_BYTES LOAD_BYTES".
int client(const std::string& socket, int index, std::int64_t start_ns, double seconds, int in_flight) {
  const kv::Layout l = reference_layout();
  Pool pool(128);
  NodeClient nc(socket, pool, l);
  connector::Connector& conn = *nc.conn;
  // The window measures steady state: the arena pinned for this GPU first.
  if (nc.wait_pinned(120s) < 0) die("the arena was not pinned within 120 s");
  if (Clock::now() > Clock::time_point(std::chrono::nanoseconds(start_ns)))
    std::fprintf(stderr, "bench_node: client %d was pinned only after the window began\n", index);
  const std::uint64_t bytes = 32 * kBlockBytes + 2 * kImageBytes;
  const auto start = Clock::time_point(std::chrono::nanoseconds(start_ns));
  const auto window = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::uint64_t next = static_cast<std::uint64_t>(index + 1) << 40, saved = 0, loaded = 0;
  std::this_thread::sleep_until(start);
  int live = 0;
  auto blocks = [](int slot) {
    std::vector<kv::BlockId> v(32);
    for (kv::BlockId b = 0; b < 32; ++b) v[b] = static_cast<kv::BlockId>(slot % 4) * 32 + b;
    return v;
  };
  std::optional<std::uint64_t> kept;  // a prompt saved whole, for the load window
  for (auto stop = start + window; Clock::now() < stop || live > 0;) {
    while (live < in_flight && Clock::now() < stop) {
      conn.save(save_spec(l, next, blocks(static_cast<int>(next))));
      ++next;
      ++live;
    }
    for (const auto& s : wait_any(conn).saves) {
      --live;
      if (!s.ok) continue;  // a full tier refuses some: counted as nothing
      if (Clock::now() <= stop) saved += bytes;
    }
  }
  // The prompt the load window reads: saved, then leased so that the other
  // clients' last saves cannot evict it (the lease is held to the end).
  for (int attempt = 0; attempt < 10 && !kept; ++attempt) {
    conn.save(save_spec(l, next, blocks(0)));
    if (!wait_any(conn).saves[0].ok) continue;
    conn.lookup(prompt_keys(l, next));
    for (bool answered = false; !answered;) {
      for (const auto& lk : conn.finished().lookups) {
        answered = true;
        if (lk.hit.tokens == 512) kept = next;
      }
      std::this_thread::sleep_for(20us);
    }
    ++next;
  }
  if (!kept) die("no prompt could be kept for the load window");
  std::uint64_t n = 0;
  for (auto stop = start + 2 * window + 500ms; Clock::now() < stop || live > 0;) {
    while (live < in_flight && Clock::now() < stop) {
      kv::TransferSpec s;
      s.request = "load-" + std::to_string(n++);
      s.tokens = {0, 512};
      s.keys = prompt_keys(l, *kept);
      s.blocks = blocks(static_cast<int>(n));
      s.with_state = true;
      s.state_slots = {static_cast<std::int32_t>(n % 4)};
      conn.load(std::move(s));  // no lease: the tier leases what it loads
      ++live;
    }
    for (const auto& r : wait_any(conn).loads) {
      --live;
      if (!r.ok) die("a load failed: " + r.reason);
      if (Clock::now() <= stop && Clock::now() >= start + window + 500ms) loaded += bytes;
    }
  }
  conn.close();
  std::printf("%llu %llu\n", static_cast<unsigned long long>(saved), static_cast<unsigned long long>(loaded));
  return 0;
}

struct Row {
  double save_gbs = 0, load_gbs = 0;
};

Row scaling(const std::string& socket, int gpus, double seconds, int in_flight) {
  const auto start = Clock::now() + 5s;  // every client registered and pinned by then
  const auto start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(start.time_since_epoch()).count();
  std::vector<FILE*> pipes;
  for (int i = 0; i < gpus; ++i) {
    const std::string cmd = "CUDA_VISIBLE_DEVICES=" + std::to_string(i) + " HIP_VISIBLE_DEVICES=" +
                            std::to_string(i) + " " + self_dir() + "/bench_node --client " + socket + " --index " +
                            std::to_string(i) + " --start-ns " + std::to_string(start_ns) + " --seconds " +
                            std::to_string(seconds) + " --in-flight " + std::to_string(in_flight);
    pipes.push_back(::popen(cmd.c_str(), "r"));
    if (!pipes.back()) die("cannot start a client");
  }
  Row r;
  for (FILE* p : pipes) {
    unsigned long long saved = 0, loaded = 0;
    if (std::fscanf(p, "%llu %llu", &saved, &loaded) != 2) die("a client failed");
    if (::pclose(p) != 0) die("a client failed");
    r.save_gbs += static_cast<double>(saved) / seconds / 1e9;
    r.load_gbs += static_cast<double>(loaded) / seconds / 1e9;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int gpus = -1, in_flight = 4, index = 0;
  double seconds = 3.0;
  std::string start_tier = "100G", scaling_tier = "4G", client_socket;
  std::int64_t start_ns = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--gpus") gpus = std::stoi(value());
    else if (a == "--seconds") seconds = std::max(0.5, std::stod(value()));
    else if (a == "--in-flight") in_flight = std::max(1, std::stoi(value()));
    else if (a == "--start-tier") start_tier = value();
    else if (a == "--scaling-tier") scaling_tier = value();
    else if (a == "--client") client_socket = value();
    else if (a == "--index") index = std::stoi(value());
    else if (a == "--start-ns") start_ns = std::stoll(value());
    else die("unknown argument " + a + " (see the file header)");
  }
  auto n = device::device_count();
  if (!n.ok() || *n == 0) die(std::string("no ") + device::backend_name() + " device");
  if (!client_socket.empty()) {
    (void)device::select_device(0);  // the one device CUDA_VISIBLE_DEVICES shows
    return client(client_socket, index, start_ns, seconds, in_flight);
  }
  if (gpus < 1) gpus = *n;
  std::printf("bench_node: backend %s, %d GPU(s) (%d visible), %.1f s windows, %d transfers in flight per client\n",
              device::backend_name(), gpus, *n, seconds, in_flight);
  std::fflush(stdout);
  if (!start_tier.empty() && start_tier != "0") start_figures(start_tier);
  Server srv(scaling_tier);
  while (!stats(srv.socket)) {
    if (srv.exited()) die("the server refused --tier-bytes " + scaling_tier);
    std::this_thread::sleep_for(5ms);
  }
  std::vector<std::pair<int, Row>> rows;
  for (int g = 1; g <= gpus; g *= 2) {
    rows.emplace_back(g, scaling(srv.socket, g, seconds, in_flight));
    std::printf("  %d GPU%s: save %7.2f GB/s, load %7.2f GB/s (aggregate)\n", g, g == 1 ? " " : "s",
                rows.back().second.save_gbs, rows.back().second.load_gbs);
    std::fflush(stdout);
    if (g < gpus && g * 2 > gpus) {
      rows.emplace_back(gpus, scaling(srv.socket, gpus, seconds, in_flight));
      std::printf("  %d GPUs: save %7.2f GB/s, load %7.2f GB/s (aggregate)\n", gpus, rows.back().second.save_gbs,
                  rows.back().second.load_gbs);
    }
  }
  const Row& one = rows.front().second;
  const auto& [g, last] = rows.back();
  std::printf("node tier scaling: save %d GPUs / 1 GPU = %.2f, load %d GPUs / 1 GPU = %.2f\n", g,
              one.save_gbs > 0 ? last.save_gbs / one.save_gbs : 0.0, g,
              one.load_gbs > 0 ? last.load_gbs / one.load_gbs : 0.0);
  return 0;
}
