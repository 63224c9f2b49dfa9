// kvstrand-server's command line: every flag validated at start-up, a bad
// value refused with a message naming the flag.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "reactor/debug_http.hpp"

namespace kvstrand::server {

struct ServerOptions {
  std::string socket = "/tmp/kvstrand.sock";
  std::uint64_t tier_bytes = 8ull << 30;
  std::uint32_t chunk_tokens = 256;
  std::chrono::seconds lock_ttl{30};
  std::chrono::seconds reap_after{300};
  std::string log_level = "info";
  std::uint32_t max_frame = 16u << 20;
  int device = 0;
  // Fault injection, sim backend only: every copy the server makes waits
  // this long first, so tests can act while a copy is in flight.
  std::chrono::milliseconds sim_copy_delay{0};
  // --http ADDR:PORT: the read-only debug endpoint (off when unset).
  std::optional<reactor::HttpOptions> http;
};

// The options, or the exit code to leave with (0 after --help; 2 after a
// refusal, which has been printed naming the flag).
std::variant<ServerOptions, int> parse_server_options(int argc, char** argv);

}  // namespace kvstrand::server
