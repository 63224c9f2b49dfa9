// kvstrand-server: the node tier's index, leases, reservations and
// liveness, on one strand. The arena is a sealed memfd handed to each
// client, which copies between it and its own device memory (RemoteIndex);
// the server touches its bytes only with --l2, --disk or --arena-path, to
// move objects to and from the levels below and to recover a named arena.
// No device runtime is linked in.
//
// - Each peer (SO_PEERCRED) is identified (peer_identity.hpp): the
//   server's own user and root, or a user --tenant-uid / --tenant-gid maps
//   to a tenant (the socket 0600, or 0660 with --socket-group); its pid
//   names the client process that owns what the session holds.
// - Every request is answered on the strand without waiting for anything
//   but the socket; one writer per session sends replies in order.
// - Leases and reservations belong to the client process, not to a clock or
//   a connection: they end by release/commit, or when the process has
//   exited (its pidfd becomes readable). A stopped client keeps them; a
//   killed one loses them at once. A connection that closes while its
//   process lives leaves them held (a copy may still run in that process);
//   another session of the same process may release them by id, another
//   process's never.
// - The arena, its indexes and its growth slab by slab are ArenaHost's.
//
// This file is the sessions (framing, back-pressure, liveness) and the
// process around them; what a request may do is RequestService's
// (request_service.hpp), what the debug endpoint shows is debug_routes.hpp.
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

  // Creates the arena, binds and listens. Throws std::runtime_error naming
  // the flag at fault (a socket already served, a path that cannot be bound,
  // an arena that cannot be made).
  void start();
  // Blocks until SIGINT or SIGTERM, or stop(). False when the server
  // stopped because it could not go on (its acceptor failed).
  bool wait();
  void stop();
  // The debug endpoint's port (--http; 0 when off).
  std::uint16_t http_port() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvstrand::server
