// kvstrand-server's reactor: one strand owns the listening socket, every
// session, every registration and lookup lock, and the tier; socket reads,
// copy completions and timers are all coroutines on it. No locks.
//
// - The socket is created 0600 and each peer's uid (SO_PEERCRED) must be the
//   server's own.
// - Each request runs as its own coroutine, so a long copy does not stop the
//   session's reads; replies go out through one writer per session.
// - Every block, slot, offset and length is checked against the registered
//   geometry before any copy (out_of_range, nothing written).
// - A session that ends (client gone, end_session, reaped) frees its locks;
//   its imported device memory is closed only when the last copy on it has
//   completed (requests in flight hold their registration).
#pragma once

#include <memory>

#include "server/server_options.hpp"

namespace kvstrand::server {

class TierServer {
 public:
  explicit TierServer(ServerOptions options);
  ~TierServer();
  TierServer(const TierServer&) = delete;
  TierServer& operator=(const TierServer&) = delete;

  // Binds and listens. Throws std::runtime_error naming the flag at fault
  // (a socket already served, a path that cannot be bound).
  void start();
  // Blocks until SIGINT or SIGTERM, or stop().
  void wait();
  void stop();
  // The debug endpoint's port (--http; 0 when off).
  std::uint16_t http_port() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvstrand::server
