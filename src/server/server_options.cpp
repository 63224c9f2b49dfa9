#include "server/server_options.hpp"

#include <CLI/CLI.hpp>
#include <cctype>
#include <iostream>

#include "hip/device.hpp"
#include "hip/sim_hooks.hpp"
#include "kv/parse_bytes.hpp"

namespace kvstrand::server {

std::variant<ServerOptions, int> parse_server_options(int argc, char** argv) {
  ServerOptions o;
  CLI::App app{"kvstrand-server: the node-wide host tier for KV-cache prefixes, shared by every engine rank"};
  std::string tier_bytes = "8G";
  std::string max_frame = "16M";
  long lock_ttl = o.lock_ttl.count(), reap_after = o.reap_after.count();
  app.add_option("--socket", o.socket, "Unix-domain socket to listen on (created 0600)")->capture_default_str();
  app.add_option("--tier-bytes", tier_bytes, "Pinned host memory for stored objects, e.g. 8G, 512M")
      ->capture_default_str();
  app.add_option("--chunk-tokens", o.chunk_tokens, "Tokens per stored chunk; registrations must match")
      ->capture_default_str();
  app.add_option("--lock-ttl", lock_ttl, "Seconds a lookup's read locks live without a retrieve")
      ->capture_default_str();
  app.add_option("--reap-after", reap_after, "Seconds without a request after which a session is reaped")
      ->capture_default_str();
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error or off")->capture_default_str();
  app.add_option("--max-frame", max_frame, "Largest frame body accepted; larger closes the connection")
      ->capture_default_str();
  app.add_option("--device", o.device, "Device ordinal the server copies with")->capture_default_str();
  std::string http;
  bool http_remote = false;
  app.add_option("--http", http, "Serve the read-only debug endpoint (/debug, /metrics) at ADDR:PORT, e.g. 127.0.0.1:9400");
  app.add_flag("--http-allow-remote", http_remote, "Allow --http on a non-loopback address (it shows every session)");
  long sim_delay_ms = 0;
  app.add_option("--sim-copy-delay-ms", sim_delay_ms,
                 "Fault injection for tests (sim backend only): every server copy waits this long first")
      ->group("Fault injection");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto refuse = [](const std::string& flag, const std::string& why) {
    std::cerr << "kvstrand-server: invalid " << flag << ": " << why << "\n";
    return 2;
  };
  auto bytes = kv::parse_bytes(tier_bytes);
  if (!bytes || *bytes == 0) return refuse("--tier-bytes", "'" + tier_bytes + "' is not a size like 8G or 512M");
  o.tier_bytes = *bytes;
  auto frame = kv::parse_bytes(max_frame);
  if (!frame || *frame < 1024 || *frame > (1ull << 30))
    return refuse("--max-frame", "'" + max_frame + "' must be a size between 1K and 1G");
  o.max_frame = static_cast<std::uint32_t>(*frame);
  if (o.socket.empty() || o.socket.size() >= 108) return refuse("--socket", "must be a path of 1 to 107 bytes");
  if (o.chunk_tokens == 0) return refuse("--chunk-tokens", "must be > 0");
  if (lock_ttl <= 0) return refuse("--lock-ttl", "must be > 0 seconds");
  if (reap_after <= 0) return refuse("--reap-after", "must be > 0 seconds");
  o.lock_ttl = std::chrono::seconds(lock_ttl);
  o.reap_after = std::chrono::seconds(reap_after);
  static const char* levels[] = {"trace", "debug", "info", "warn", "error", "off"};
  if (std::find(std::begin(levels), std::end(levels), o.log_level) == std::end(levels))
    return refuse("--log-level", "'" + o.log_level + "' is not one of trace, debug, info, warn, error, off");
  if (o.device < 0) return refuse("--device", "must be >= 0");
  if (sim_delay_ms < 0 || sim_delay_ms > 60'000) return refuse("--sim-copy-delay-ms", "must be 0 to 60000");
  if (sim_delay_ms > 0 && !hip::sim::available())
    return refuse("--sim-copy-delay-ms", "only the sim backend injects faults; this server uses " +
                                             std::string(hip::backend_name()));
  o.sim_copy_delay = std::chrono::milliseconds(sim_delay_ms);
  if (!http.empty()) {
    auto h = reactor::parse_http_address(http);
    if (!h) return refuse("--http", "'" + http + "' is not ADDR:PORT, e.g. 127.0.0.1:9400");
    h->allow_non_loopback = http_remote;
    if (auto e = reactor::validate(*h))
      return refuse("--http", e->message);
    o.http = *h;
  } else if (http_remote) {
    return refuse("--http-allow-remote", "needs --http");
  }
  return o;
}

}  // namespace kvstrand::server
