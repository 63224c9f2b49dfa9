// A redis-server process the demo starts for its tier-l2 arm when --l2 does
// not name one: plain Redis on a free loopback port, no persistence, its
// memory bounded with allkeys-lru (the settings the README recommends).
// Stopped (SIGTERM, then reaped) when this object goes away.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "demo_process.hpp"

namespace kvstrand::engine {

class DemoRedis {
 public:
  // Throws std::runtime_error saying what failed when `binary` cannot be
  // started or does not answer PING within 10 s.
  DemoRedis(const std::string& binary, std::uint64_t max_bytes);
  DemoRedis(const DemoRedis&) = delete;
  DemoRedis& operator=(const DemoRedis&) = delete;

  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  int port_ = 0;
  std::optional<DemoProcess> process_;
};

}  // namespace kvstrand::engine
