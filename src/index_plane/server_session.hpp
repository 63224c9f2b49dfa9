// This process's session with kvstrand-server: the connection's whole
// life, apart from what the requests on it mean (RemoteIndex).
//
// All on the reactor strand:
// - connect, with back-off: attempts back off (kFirstBackoff doubling to
//   kMaxBackoff); requests between attempts are turned away at once;
// - trust: only a server run by this process's user, root, or server_uid
//   (SO_PEERCRED) is spoken to;
// - hello: the reply brings the server's arena, a sealed memfd, mapped
//   here and pinned slab by slab on helper threads (ArenaPinning); a
//   server restarted on the same named arena keeps its mapping;
// - registration: every registration is registered on every connection; a
//   registration made while no server answers is kept and registered when
//   one does (attached in the background, no request needed); one an
//   answering server refuses is refused to the engine when it registers,
//   and, refused on a later connection, runs without the tier, said once;
// - the connection lost: every request waiting fails at once, and
//   attaching starts again; holds whose release could not be sent are sent
//   to the same server once connected again, never to a restarted one
//   (its hold ids name other holds).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/gate.hpp"
#include "common/notifier.hpp"
#include "proto/protocol.hpp"
#include "index_plane/arena_mapping.hpp"
#include "index_plane/arena_pinning.hpp"
#include "index_plane/index_plane.hpp"
#include "reactor/reactor.hpp"
#include "index_plane/server_calls.hpp"

namespace kvstrand::index_plane {

struct ServerSessionOptions {
  std::string socket;
  std::chrono::milliseconds request_timeout{10'000};
  int device = 0;  // the device the arena is pinned for
  std::int64_t server_uid = -1;  // a server run by this uid is trusted too (ConnectorOptions::server_uid)
  // A published tenant to read (PageStoreOptions::reads_tenant): the arena
  // handed over is that tenant's segment, mapped read-only.
  std::string reads;
};

// What a refusal's status means to the transfer that asked.
std::error_code status_error(proto::Status s);

class ServerSession {
 public:
  using Clock = std::chrono::steady_clock;

  // `registrations`: the index plane's table, read as it grows (attach()).
  ServerSession(reactor::Reactor& reactor, ServerSessionOptions options, const Registrations& registrations);
  ~ServerSession();
  ServerSession(const ServerSession&) = delete;
  ServerSession& operator=(const ServerSession&) = delete;

  // Registration `id`, just added to the table (the last): registered now
  // where a server answers. Its refusal by an answering server is returned
  // (and the session forgets it, as the table does); no server answering
  // is no failure (kept, registered when one answers).
  boost::asio::awaitable<Failure> attach(std::uint32_t id);
  // Connected, and `registration` taken by this server (else why not): a
  // request's way in, turned away at once between attempts.
  boost::asio::awaitable<Failure> usable(std::uint32_t registration);

  // The server's id of a registration this session registered.
  std::uint32_t server_registration(std::uint32_t id) const { return server_regs_.at(id); }
  std::uint8_t server_minor() const noexcept { return server_minor_; }
  const std::string& socket() const noexcept { return opt_.socket; }
  std::chrono::milliseconds request_timeout() const noexcept { return opt_.request_timeout; }
  bool connected() const noexcept { return connected_; }

  ServerCalls& calls() noexcept { return calls_; }
  // The current server life's arena: an alias of the mapping whose owner is
  // that life's own, so that current() tells lives apart on one mapping.
  const std::shared_ptr<ArenaMapping>& arena() const noexcept { return arena_; }
  // Whether `arena` is the current server life's.
  bool current(const std::shared_ptr<void>& arena) const;
  // Resumes once `arena` is pinned up to `end` (ArenaPinning::up_to).
  boost::asio::awaitable<std::error_code> pinned(std::shared_ptr<ArenaMapping> arena, std::uint64_t end) {
    return pinning_.up_to(std::move(arena), end);
  }
  const std::string& pinning_error() const noexcept { return pinning_.error(); }

  // Releases a hold granted by the server whose arena is `of`. A hold id
  // means something only to the server that granted it: a restarted server
  // numbers its holds afresh, so an old id may name another process's hold
  // there. A hold of a server that is gone went with it: nothing is sent.
  void release_hold(std::uint64_t hold, const std::shared_ptr<ArenaMapping>& of);
  // tier_unavailable, saying the socket path and `why`.
  Failure unreachable(const std::string& why) const;

  // Turned away, refused, mapped, kept, pinned: the link's counters.
  IndexPlane::ServerLink link() const;

  // Ends the session: says EndSession where connected (bounded), then ends
  // the connection and pinning and waits (bounded) for what runs inside it.
  boost::asio::awaitable<void> close();

 private:
  boost::asio::awaitable<Failure> ensure_connected();
  // One attempt (the handshake and every registration); a failure backs
  // the next one off.
  boost::asio::awaitable<Failure> connect_now();
  // While registrations wait for a server: attempts on the backoff's clock
  // with no request needed, so that the arena is mapped and pinned before
  // the engine's next request (an engine idle at start-up, a server
  // restarted). One loop at a time, inside the gate.
  void keep_attaching();
  boost::asio::awaitable<void> attach_in_background();
  boost::asio::awaitable<Failure> handshake();
  boost::asio::awaitable<Failure> hello(Clock::time_point until);
  // Registers regs_[i] with the server (on a connection that said hello).
  boost::asio::awaitable<Failure> register_one(std::size_t i, Clock::time_point until);
  // Ends the connection (every request on it fails with why).
  void drop_connection(const std::string& why);
  // The connection ended: attached no more, and attaching again.
  void connection_lost(const std::string& why);
  // A lookup's or reserve's reply that came after its caller gave up.
  void late_reply(const proto::Reply& r);

  static constexpr std::chrono::milliseconds kFirstBackoff{50};
  static constexpr std::chrono::milliseconds kMaxBackoff{2000};
  // How long close() waits for the reader, the writer and pinning to end.
  static constexpr std::chrono::milliseconds kCloseBound{1000};

  reactor::Reactor& reactor_;
  ServerSessionOptions opt_;
  common::Gate gate_;  // every coroutine this session starts runs inside it
  const Registrations& regs_;               // the index plane's
  std::vector<Failure> refused_;            // by registration id: the server's refusal on this connection
  std::optional<std::size_t> attaching_;    // the registration attach() is registering (its refusal: returned)
  Failure down_;                            // why no server answers (empty while attached)
  std::chrono::milliseconds backoff_{0};
  Clock::time_point next_attempt_{};
  std::uint64_t turned_away_ = 0;
  std::uint64_t connect_attempts_ = 0;
  std::uint64_t refusals_ = 0;
  ServerCalls calls_;              // the current connection's requests and replies
  std::uint64_t connections_ = 0;  // attempts made (a later one that attaches is a reconnect)
  bool connected_ = false;
  bool connecting_ = false;
  bool closed_ = false;              // close() began: no attempt starts any more
  bool attaching_in_background_ = false;
  common::Notifier connect_ended_;  // an attempt ended (connect_now), or close() began
  std::vector<std::uint32_t> server_regs_;  // the server's id of each, on this connection
  std::uint64_t reconnects_ = 0;
  // Holds to release once connected again (to the server that granted them).
  std::vector<std::pair<std::uint64_t, std::shared_ptr<ArenaMapping>>> unsent_releases_;
  std::shared_ptr<ArenaMapping> mapping_;  // the arena as this process mapped and pinned it
  std::shared_ptr<ArenaMapping> arena_;    // the current server life's token: an alias of mapping_
  std::uint8_t server_minor_ = 0;          // the current server's protocol minor version
  bool warned_tenant_ = false;             // a tenant not told to a 2.3 server: said once
  std::uint64_t server_id_ = 0;            // the current server life's id (0: a 2.1 server says none)
  uid_t server_uid_ = 0;                   // the connected server's user (SO_PEERCRED), a trusted one
  std::uint64_t arena_mapped_ = 0;         // arenas mapped (and pinned): one per server life but where kept
  std::uint64_t arena_kept_ = 0;           // server restarts whose named arena was kept mapped and pinned

  // Pinning of the current arena for this process's device; last: its
  // helper threads are joined before the mappings they pin go.
  ArenaPinning pinning_;
};

}  // namespace kvstrand::index_plane
