// kvstrand-engine-demo: the example engine on the seed's workload, one arm
// after another, with every resumed request checked against a full
// recompute. See examples/engine/engine.hpp and the README.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "demo_redis.hpp"
#include "demo_server.hpp"
#include "engine.hpp"
#include <kvstrand/errors.hpp>
#include <kvstrand/version.hpp>
#include "report.hpp"
#include "toy_model.hpp"

using namespace kvstrand;
using namespace kvstrand::engine;

namespace {

kv::Layout seed_layout(std::uint32_t bytes_scale, bool speculative) {
  kv::Layout l;
  l.model_id = "toy-hybrid";
  l.layout_name = "toy-5plane";
  // The seed's 739,840 B per block over 5 planes, divided by --bytes-scale.
  const std::uint64_t per_plane = 739'840 / 5 / bytes_scale / 256 * 256;
  for (int p = 0; p < 5; ++p) l.planes.push_back({"plane" + std::to_string(p), per_plane});
  // The seed's blocks hold 256 tokens (28 blocks, 21.3 MiB, hold a whole
  // 7097-token prompt): one block per chunk.
  l.block_tokens = 256;
  l.chunk_tokens = 256;
  l.checkpoint = {"swa-ring+cursor", std::max<std::uint64_t>(4096, (1u << 20) / bytes_scale), 256};
  l.sliding_window = ToyState::kRing;
  l.dtype = "fp8";
  if (speculative) l.speculative = {"mtp", 1, {}};
  return l;
}

// "1G", "512M", "4096": a size as the flags take it (K, M, G, T: powers of
// 1024); none for anything else.
std::optional<std::uint64_t> size_of(const std::string& text) {
  static const std::string units = "KMGT";
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return std::nullopt;
  std::size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(text, &used);
  } catch (const std::out_of_range&) {
    return std::nullopt;
  }
  if (used == text.size()) return n;
  const auto unit = units.find(static_cast<char>(std::toupper(static_cast<unsigned char>(text[used]))));
  if (unit == std::string::npos || used + 1 != text.size()) return std::nullopt;
  const unsigned shift = 10 * static_cast<unsigned>(unit + 1);
  if (n > (~0ull >> shift)) return std::nullopt;
  return n << shift;
}

// A named arena of the demo's own (tier-node, tier-kill), removed after the arm.
struct ArenaPath {
  std::string path;
  explicit ArenaPath(const std::string& arm)
      : path("/dev/shm/kvstrand-demo-" + std::to_string(::getpid()) + "-" + arm) {
    ::unlink(path.c_str());
  }
  ~ArenaPath() {
    ::unlink(path.c_str());
    ::unlink((path + ".lock").c_str());
  }
  ArenaPath(const ArenaPath&) = delete;
  ArenaPath& operator=(const ArenaPath&) = delete;
};

// A disk directory of the demo's own (tier-disk), removed after the arm.
struct DiskDir {
  std::string path;
  explicit DiskDir(const std::string& under)
      : path((std::filesystem::absolute(under) / ("kvstrand-demo-disk-" + std::to_string(::getpid()))).string()) {
    std::filesystem::create_directories(path);
  }
  ~DiskDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  DiskDir(const DiskDir&) = delete;
  DiskDir& operator=(const DiskDir&) = delete;
};

// An arm beside tier-node, the same server with the whole working set in
// its arena: what the SIGKILL and restart (tier-kill), or an arena too
// small but for a disk under it (tier-disk), cost.
void compare_with_node(const std::vector<ArmSummary>& arms, const std::string& name) {
  const ArmSummary* node = nullptr;
  const ArmSummary* other = nullptr;
  for (const auto& a : arms) {
    if (a.name == "tier-node") node = &a;
    if (a.name == name) other = &a;
  }
  if (!node || !other || node->req_per_s <= 0) return;
  std::printf("\n%s against tier-node: req/s %.2f vs %.2f (ratio %.3f); prompt tokens from HBM + tier "
              "%.1f%% vs %.1f%% (ratio %.3f); mismatches %llu\n",
              name.c_str(), other->req_per_s, node->req_per_s, other->req_per_s / node->req_per_s,
              other->hbm_share + other->tier_share, node->hbm_share + node->tier_share,
              (other->hbm_share + other->tier_share) / std::max(1e-9, node->hbm_share + node->tier_share),
              static_cast<unsigned long long>(other->mismatches + node->mismatches));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvstrand-engine-demo: the example engine on the seed's workload, every arm, correctness on"};
  double seconds = 40;
  bool full = false, no_verify = false, no_draft = false;
  std::string arms_list = "none,hbm,tier,tier+spec,hbm-fit,tier-fit,tier-restart,tier-l2", server,
              server_binary = DemoServer::default_binary(), out = "demo-results", l2_url,
              redis_binary = "/usr/bin/redis-server",
              log_level = "warn", tier_bytes_text = "1G";
  std::uint32_t bytes_scale = 16, pool_blocks = 4000, concurrency = 16, prompts = 512, fit_prompts = 16;
  double time_scale = 0.25;
  app.add_option("--seconds", seconds, "Measured modeled seconds per arm, after the warm-up")->capture_default_str();
  app.add_flag("--full", full, "The seed's run: 180 s per arm");
  app.add_option("--arms", arms_list,
                 "Arms: none (no prefix reuse), hbm (HBM prefix cache), tier (HBM + tier), tier+spec (the same "
                 "under speculative decoding: prefill tail 2), hbm-fit / tier-fit (a working set that fits HBM), "
                 "tier-restart (a fresh engine on a node tier another engine filled: the fit working set), "
                 "tier-l2 (node A's engine fills A, which writes behind to Redis and stops; a fresh engine on "
                 "node B, whose arena is empty, is served through L2); not run unless named: tier-node (the tier "
                 "arm on a kvstrand-server of the demo's own, on a named arena), tier-kill (the same, the "
                 "server SIGKILLed and restarted half-way through the measured window) and tier-disk (the same "
                 "with an arena of --disk-arena-bytes, smaller than the working set, over a disk tier in "
                 "--disk-dir)")
      ->capture_default_str();
  app.add_option("--tier-bytes", tier_bytes_text, "Embedded tier size (1G holds the default run)")
      ->capture_default_str();
  std::string disk_dir = ".", disk_arena_text = "256M";
  app.add_option("--disk-dir", disk_dir, "tier-disk: the directory (on a disk) for its server's disk tier")
      ->capture_default_str();
  app.add_option("--disk-arena-bytes", disk_arena_text,
                 "tier-disk: its server's arena, smaller than the working set (its disk holds twice --tier-bytes)")
      ->capture_default_str();
  app.add_option("--server", server, "Tier arms use kvstrand-server at this socket instead of the embedded tier");
  app.add_option("--server-binary", server_binary,
                 "kvstrand-server that tier-restart starts for itself when --server is not given")
      ->capture_default_str();
  app.add_option("--l2", l2_url, "tier-l2: Redis (Cluster) at redis://HOST:PORT[,...] instead of one it starts");
  app.add_option("--redis-binary", redis_binary, "redis-server that tier-l2 starts for itself when --l2 is not given")
      ->capture_default_str();
  app.add_option("--bytes-scale", bytes_scale, "Divide the seed's block and checkpoint bytes by this (memory)")
      ->capture_default_str();
  app.add_option("--pool-blocks", pool_blocks, "HBM pool blocks")->capture_default_str();
  app.add_option("--concurrency", concurrency, "Requests outstanding")->capture_default_str();
  app.add_option("--prompts", prompts,
                 "Distinct prompts cycled through; more than HBM holds, so only the tier serves a second pass")
      ->capture_default_str();
  app.add_option("--fit-prompts", fit_prompts, "Distinct prompts of the -fit arms (fits HBM)")->capture_default_str();
  app.add_option("--time-scale", time_scale,
                 "Real seconds per modeled second in the measured window (1 with --full; 0: as fast as possible)")
      ->capture_default_str();
  app.add_flag("--no-verify", no_verify, "Skip the comparison with a full recompute");
  app.add_flag("--no-draft-cache", no_draft,
               "One registration only: no draft model's cache (by default a second registration, saved, looked up "
               "and loaded beside the target's KV and state)");
  app.add_option("--out", out, "Directory for the JSON and PNG")->capture_default_str();
  app.add_option("--log-level", log_level, "spdlog level")->capture_default_str();
  std::string http_text;
  app.add_option("--http", http_text,
                 "Serve the connector's debug endpoint (/debug, /metrics) at ADDR:PORT during the tier arms");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));
  if (full) {
    seconds = 180;
    time_scale = 1.0;
  }
  const auto disk_arena_bytes = size_of(disk_arena_text);
  if (!disk_arena_bytes || *disk_arena_bytes == 0) {
    std::fprintf(stderr, "kvstrand-engine-demo: invalid --disk-arena-bytes: '%s' is not a size like 256M\n",
                 disk_arena_text.c_str());
    return 2;
  }
  const auto tier_bytes = size_of(tier_bytes_text);
  if (!tier_bytes || *tier_bytes == 0) {
    std::fprintf(stderr, "kvstrand-engine-demo: invalid --tier-bytes: '%s' is not a size like 1G\n",
                 tier_bytes_text.c_str());
    return 2;
  }
  // --http ADDR:PORT: the Connector's debug_address and debug_port (it
  // refuses an address that is not loopback when the tier arm starts).
  std::string http_address;
  int http_port = -1;
  if (!http_text.empty()) {
    const auto colon = http_text.rfind(':');
    const std::string port_text = colon == std::string::npos ? "" : http_text.substr(colon + 1);
    if (colon == 0 || port_text.empty() || port_text.size() > 5 ||
        port_text.find_first_not_of("0123456789") != std::string::npos || std::stoi(port_text) > 65535) {
      std::fprintf(stderr, "kvstrand-engine-demo: invalid --http: '%s' is not ADDR:PORT\n", http_text.c_str());
      return 2;
    }
    http_address = http_text.substr(0, colon);
    http_port = std::stoi(port_text);
  }
  if (prompts == 0 || fit_prompts == 0) {
    std::fprintf(stderr, "kvstrand-engine-demo: invalid --prompts / --fit-prompts: must be > 0\n");
    return 2;
  }
  if (bytes_scale == 0 || bytes_scale > 512) {  // beyond 512 a plane's block rounds down to nothing
    std::fprintf(stderr, "kvstrand-engine-demo: invalid --bytes-scale: must be 1 to 512\n");
    return 2;
  }
  static const std::vector<std::string> known = {"none",         "hbm",     "tier",      "tier+spec", "hbm-fit",
                                                  "tier-fit",     "tier-restart", "tier-l2", "tier-node", "tier-kill",
                                                  "tier-disk"};
  {
    std::stringstream check(arms_list);
    for (std::string arm; std::getline(check, arm, ',');)
      if (std::find(known.begin(), known.end(), arm) == known.end()) {
        std::fprintf(stderr, "kvstrand-engine-demo: invalid --arms: unknown arm '%s' (known: none, hbm, tier, "
                     "tier+spec, hbm-fit, tier-fit, tier-restart, tier-l2, tier-node, tier-kill, tier-disk)\n",
                     arm.c_str());
        return 2;
      }
  }
  try {
    (void)DeviceStream::create();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvstrand-engine-demo: no %s device: %s\n", backend(), e.what());
    return 1;
  }

  Workload w;
  std::printf("kvstrand-engine-demo: %s backend; %u prompts (%u prefixes x %u + tails of %u tokens on average), "
              "%u outputs, "
              "concurrency %u, pool %u blocks of %llu B%s, %g modeled s measured per arm%s\n",
              backend(), prompts, w.prefixes, w.prefix_tokens, w.tail_tokens, w.output_tokens, concurrency,
              pool_blocks, static_cast<unsigned long long>(seed_layout(bytes_scale, false).bytes_per_block()),
              no_draft ? "" : " + a draft model's cache (a second registration)", seconds, server.empty() ? "" : (", tier: kvstrand-server at " + server).c_str());
  std::printf("  tier arms first run one pass over every prompt (warm-up, as fast as the host can), then measure "
              "the next pass in modeled real time\n");
  const bool tty = ::isatty(2);
  std::vector<ArmSummary> results;
  std::uint64_t resumed = 0, mismatches = 0;
  std::stringstream list(arms_list);
  for (std::string arm; std::getline(list, arm, ',');) {
    EngineConfig c;
    c.layout = seed_layout(bytes_scale, arm == "tier+spec");
    c.pool_blocks = pool_blocks;
    c.concurrency = concurrency;
    c.hbm_cache = arm != "none";
    c.tier = arm.starts_with("tier");
    c.server_socket = server;
    c.tier_bytes = *tier_bytes;
    const bool restart = arm == "tier-restart";
    const bool via_l2 = arm == "tier-l2";
    const bool kill = arm == "tier-kill";
    const bool on_disk = arm == "tier-disk";
    const bool own_node = kill || on_disk || arm == "tier-node";
    w.distinct = arm.ends_with("-fit") || restart || via_l2 ? fit_prompts : prompts;
    // Tier arms measure a second pass; the others need only their first
    // requests out of the way. tier-l2 measures from its first request:
    // that pass is the one L2 serves.
    const std::uint32_t warmup = via_l2 ? 0 : c.tier ? w.distinct : 2 * concurrency;
    c.time_scale = time_scale;
    c.verify = !no_verify;
    c.draft_cache = !no_draft;
    if (c.tier && http_port >= 0) {
      c.debug_port = http_port;
      c.debug_address = http_address;
    }
    try {
      // tier-restart: another engine fills a node tier with one pass (the
      // demo's own server unless --server names one), then the measured
      // engine starts with an empty HBM on that warm tier.
      std::optional<DemoServer> own_server;
      std::optional<DemoRedis> own_redis;
      if (via_l2) {
        // Two nodes of their own (not --server): A is filled and stopped
        // (SIGTERM: it writes everything behind first), B starts empty.
        std::string url = l2_url;
        if (url.empty()) {
          if (!std::filesystem::exists(redis_binary)) {
            std::printf("  tier-l2: skipped: no %s (install redis-server, or give --l2 or --redis-binary)\n",
                        redis_binary.c_str());
            continue;
          }
          own_redis.emplace(redis_binary, *tier_bytes);
          url = own_redis->url();
        }
        const std::vector<std::string> l2_flags = {"--l2", url, "--l2-timeout", "2000", "--l2-max-inflight", "100000"};
        {
          DemoServer node_a(server_binary, *tier_bytes, c.layout.chunk_tokens, l2_flags);
          EngineConfig fill = c;
          fill.server_socket = node_a.socket_path();
          fill.time_scale = 0;
          fill.debug_port = -1;
          Engine(fill, w).run(w.distinct, 0);
        }
        own_server.emplace(server_binary, *tier_bytes, c.layout.chunk_tokens, l2_flags);
        c.server_socket = own_server->socket_path();
      }
      // tier-node, tier-kill: a server of the demo's own on a named arena,
      // whatever --server says (tier-kill must be able to kill it).
      // tier-disk: the same, its arena smaller than the working set, over a
      // disk tier twice --tier-bytes.
      std::optional<ArenaPath> arena_file;
      std::optional<DiskDir> disk;
      std::uint16_t metrics_port = 0;
      if (own_node) {
        arena_file.emplace(arm);
        std::vector<std::string> flags{"--arena-path", arena_file->path};
        if (on_disk) {
          disk.emplace(disk_dir);
          metrics_port = DemoServer::serve_metrics();
          for (const std::string& f : {std::string("--disk"), disk->path, std::string("--disk-bytes"),
                                       std::to_string(2 * *tier_bytes), std::string("--http"),
                                       "127.0.0.1:" + std::to_string(metrics_port)})
            flags.push_back(f);
        }
        own_server.emplace(server_binary, on_disk ? *disk_arena_bytes : *tier_bytes, c.layout.chunk_tokens, flags);
        c.server_socket = own_server->socket_path();
      }
      if (restart) {
        if (server.empty()) {
          own_server.emplace(server_binary, *tier_bytes, c.layout.chunk_tokens);
          c.server_socket = own_server->socket_path();
        }
        EngineConfig fill = c;
        fill.time_scale = 0;
        fill.debug_port = -1;
        Engine(fill, w).run(w.distinct, 0);
      }
      Engine engine(c, w);
      if (engine.connector() && engine.connector()->debug_port() != 0) {
        std::printf("  %s: debug endpoint on http://%s:%u/debug\n", arm.c_str(), c.debug_address.c_str(),
                    engine.connector()->debug_port());
        std::fflush(stdout);
      }
      double printed = -100;
      bool killed = false;
      auto progress = [&](const Progress& p) {
        if (kill && !killed && p.measured_seconds >= seconds / 2) {
          killed = true;
          const double took = own_server->kill_and_restart();
          std::fprintf(stderr, "  tier-kill: kvstrand-server SIGKILLed at %.1f modeled s of the window, "
                       "restarted on its arena (accepting after %.3f s)\n", p.measured_seconds, took);
        }
        if (!tty && p.modeled_seconds - printed < 30) return;  // a log file gets a line every 30 s
        printed = p.modeled_seconds;
        std::fprintf(stderr, "%s  %-10s modeled %6.1f s, %5llu requests done%s", tty ? "\r" : "", arm.c_str(),
                     p.modeled_seconds, static_cast<unsigned long long>(p.done), tty ? "" : "\n");
      };
      RunStats st = engine.run(warmup, seconds, 0, progress);
      if (kill && !killed) {
        std::fprintf(stderr, "kvstrand-engine-demo: tier-kill: the window ended before the server was killed\n");
        return 1;
      }
      if (c.hbm_cache) {
        const auto bad = engine.verify_checkpoints(st);
        st.mismatches += bad;
      }
      if (tty) std::fprintf(stderr, "\r%70s\r", "");
      if (on_disk && metrics_port != 0) {
        auto m = [&](const char* name) { return DemoServer::metric(metrics_port, name); };
        std::printf("  tier-disk: arena %s of a working set of %.0f MiB: %.0f objects written to disk, %.0f read "
                    "back into the arena, %.0f checksum failures, %.0f lookups past --disk-timeout\n",
                    disk_arena_text.c_str(),
                    (m("kvstrand_server_disk_used_bytes") + 0) / double(1 << 20),
                    m("kvstrand_server_disk_written_total"), m("kvstrand_server_disk_promoted_total"),
                    m("kvstrand_server_disk_checksum_failures_total"), m("kvstrand_server_disk_timeouts_total"));
      }
      results.push_back(summarize(arm, st, c.cost));
      resumed += st.resumed;
      mismatches += st.mismatches;
      for (const auto& d : st.mismatch_details) std::fprintf(stderr, "  mismatch: %s\n", d.c_str());
      for (const auto& f : st.load_failures) std::fprintf(stderr, "  failed load: %s\n", f.c_str());
    } catch (const FailStop& e) {
      std::fprintf(stderr, "kvstrand-engine-demo: arm %s stopped: %s\n", arm.c_str(), e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvstrand-engine-demo: arm %s: %s\n", arm.c_str(), e.what());
      return 1;
    }
  }
  print_table(results);
  compare_with_node(results, "tier-kill");
  compare_with_node(results, "tier-disk");
  std::printf("\nseed (MI355X, TP4): none 4.62 req/s, hbm 6.90, hbm+tier 7.80 (77%% of its cost model's 10.11)\n");
  std::filesystem::create_directories(out);
  const std::string json = out + "/engine-demo.json";
  std::ostringstream cfg;
  cfg << "{\"backend\": \"" << backend() << "\", \"prompts\": " << prompts << ", \"seconds\": " << seconds
      << ", \"fit_prompts\": " << fit_prompts << ", \"bytes_scale\": " << bytes_scale << ", \"pool_blocks\": " << pool_blocks
      << ", \"concurrency\": " << concurrency << ", \"server\": " << (server.empty() ? "false" : "true") << "}";
  std::ofstream(json) << to_json(results, cfg.str());
  std::printf("results: %s; plot: %s\n", json.c_str(), plot(results, out).c_str());
  std::printf("resumed requests: %llu, mismatches: %llu\n", static_cast<unsigned long long>(resumed),
              static_cast<unsigned long long>(mismatches));
  return mismatches == 0 ? 0 : 3;
}
