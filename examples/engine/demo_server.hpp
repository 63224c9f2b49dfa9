// A kvstrand-server process the demo starts for itself: the tier-restart arm
// needs a tier that outlives an engine, and without --server there is none;
// the tier-l2 arm needs two, one per node, on one Redis.
// Stopped (SIGTERM, then reaped) when this object goes away.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "demo_process.hpp"

namespace kvstrand::engine {

class DemoServer {
 public:
  // Starts `binary` on a fresh socket. Throws std::runtime_error saying
  // what failed when it cannot be started or does not accept within 30 s.
  // `extra`: more flags (the tier-l2 arm's --l2 ...).
  DemoServer(const std::string& binary, std::uint64_t tier_bytes, std::uint32_t chunk_tokens,
             const std::vector<std::string>& extra = {});
  ~DemoServer();
  DemoServer(const DemoServer&) = delete;
  DemoServer& operator=(const DemoServer&) = delete;

  const std::string& socket_path() const { return socket_; }

  // SIGKILLs the server and starts it again with the same flags on the same
  // socket (tier-kill: with --arena-path it finds its objects again).
  // Returns the seconds until the new one accepts.
  double kill_and_restart();

  // A loopback port free now, for a server's --http (0 if none).
  static std::uint16_t serve_metrics();
  // A sample of the server's /metrics at `port` (-1 when not there).
  static double metric(std::uint16_t port, const std::string& name);

  // kvstrand-server beside this program in the build and in the GPU pack
  // (two folders up from this program's: the build's root).
  static std::string default_binary();

 private:
  void start();

  std::string socket_;
  std::vector<std::string> args_;
  std::optional<DemoProcess> process_;
};

}  // namespace kvstrand::engine
