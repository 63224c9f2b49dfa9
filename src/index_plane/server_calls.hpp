// Requests to kvstrand-server and their replies, over one connection at a
// time, on the reactor strand (RemoteIndex's; it owns what the requests
// mean, this only carries them).
//
// - Each request gets an id and a waiter: a timer cancelled by its reply
//   (or by the connection's end), expiring at the request's bound.
// - One reader matches replies to waiters by id. A reply of another type
//   than its request, or a frame that is not the protocol, ends the
//   connection: nothing after it on the stream can be trusted.
// - A reply that comes after its waiter gave up is handed to `late`, so that
//   what it grants (a lease, a reservation) is released.
// - The connection ends once. Every waiter then fails at once with why
//   (tier_unavailable: no copy was made for it); `lost` is told when the
//   connection ended by itself (a read or write failed, a protocol error, an
//   exception), not when the owner ended it.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <utility>

#include "channel/framed_connection.hpp"
#include "common/gate.hpp"
#include "common/strand.hpp"
#include "proto/protocol.hpp"

namespace kvstrand::index_plane {

class ServerCalls {
 public:
  using Clock = std::chrono::steady_clock;
  using Late = std::function<void(const proto::Reply&)>;
  using Lost = std::function<void(const std::string& why)>;

  // `gate`: the owner's, where the reader and the connection's writer run.
  ServerCalls(common::Strand strand, common::Gate& gate, Late late, Lost lost);
  ~ServerCalls();
  ServerCalls(const ServerCalls&) = delete;
  ServerCalls& operator=(const ServerCalls&) = delete;

  // A new connection (any previous one ended first). Nothing is read from
  // it until read_replies(): the owner reads the hello's reply by hand.
  void open(channel::FramedConnection::Socket sock);
  // The current connection (null after end()); its holder keeps it alive,
  // ended or not.
  std::shared_ptr<channel::FramedConnection> connection() const { return conn_; }
  bool is_open() const noexcept { return conn_ && !conn_->closed(); }
  std::uint64_t next_id() noexcept { return next_id_++; }

  // Starts the reader. False, and nothing started, when the gate is closing.
  bool read_replies();

  // One request, one reply, or an error: tier_unavailable when the
  // connection failed (the reply's message says why) or `until` passed.
  boost::asio::awaitable<std::pair<std::error_code, proto::Reply>> call(proto::Request req, Clock::time_point until);
  // A request whose reply nobody waits for (a release): written once the
  // handler that sent it has returned.
  void send_only(const proto::Request& req);

  // Ends the connection: every waiter fails with `why`; replies still to
  // come are not read.
  void end(const std::string& why);

 private:
  struct Waiter;
  boost::asio::awaitable<void> read_loop(std::shared_ptr<channel::FramedConnection> conn);
  void fail(const std::string& why);  // the connection ended by itself

  common::Strand strand_;
  common::Gate& gate_;
  Late late_;
  Lost lost_;
  std::shared_ptr<channel::FramedConnection> conn_;  // null: none
  std::uint64_t generation_ = 0;                    // bumps on every open()
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, std::shared_ptr<Waiter>> waiting_;
  std::map<std::uint64_t, proto::Type> abandoned_;  // timed out: what their replies grant goes to `late`
};

}  // namespace kvstrand::index_plane
