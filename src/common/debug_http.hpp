// A read-only HTTP/1.1 debug endpoint (Boost.Beast) whose connections are
// coroutines on a reactor's own strand: a route reads the state it shows
// directly, without locks or copies across threads.
//
// - Off unless configured; binds 127.0.0.1 by default. A non-loopback
//   address is refused unless `allow_non_loopback` is set.
// - GET and HEAD only; every route is read-only.
// - A slow or malformed client costs one coroutine and one socket: a
//   request must arrive whole within `request_timeout` of the connection's
//   start (or of its last answer), headers are bounded by `header_limit`,
//   writes by `idle_timeout`, connections by `max_connections`. Past that
//   bound, a new connection takes the place of the oldest one still
//   waiting for its request (a client that never finishes its header), so
//   connections that send nothing cannot keep a probe of /healthz out. None
//   of it can stall the strand's transfers.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <kvstrand/layout.hpp>
#include "common/strand.hpp"

namespace kvstrand::common {

struct HttpOptions {
  std::string address = "127.0.0.1";
  std::uint16_t port = 0;  // 0: any free port (DebugHttp::port() says which)
  bool allow_non_loopback = false;
  std::size_t max_connections = 64;
  std::uint32_t header_limit = 8 * 1024;
  std::chrono::milliseconds idle_timeout{10'000};
  std::chrono::milliseconds request_timeout{2'000};
  // When set, every route but /healthz and /readyz (the probes) needs
  // "Authorization: Bearer TOKEN" (401 otherwise): the pages show client
  // pids, holds and namespaces, and loopback is open to every local user.
  std::string token;
};

// Refuses an address that is not an IP address, or one that is not loopback
// without allow_non_loopback, naming the option.
std::optional<kv::ConfigError> validate(const HttpOptions& options);

// "ADDR:PORT" as a flag gives it; none when it is not one.
std::optional<HttpOptions> parse_http_address(const std::string& text);

struct HttpResponse {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// A route runs on the reactor strand when its path is requested.
using HttpRoutes = std::map<std::string, std::function<HttpResponse()>>;

class DebugHttp {
 public:
  // Binds and starts accepting on `strand`. Throws std::invalid_argument
  // naming the option when the options are refused or the address cannot be
  // bound. Call from any thread but the strand's.
  DebugHttp(Strand& strand, HttpOptions options, HttpRoutes routes);
  ~DebugHttp();
  DebugHttp(const DebugHttp&) = delete;
  DebugHttp& operator=(const DebugHttp&) = delete;

  std::uint16_t port() const noexcept { return port_; }
  // Closes the listener and every connection. Idempotent; call from any
  // thread but the reactor's, before the reactor stops.
  void stop();

  struct State;

 private:
  Strand& strand_;
  std::shared_ptr<State> state_;
  std::uint16_t port_ = 0;
  bool stopped_ = false;
};

}  // namespace kvstrand::common
