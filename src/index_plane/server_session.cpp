#include "index_plane/server_session.hpp"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/await_codes.hpp"
#include "common/log_escaped.hpp"
#include "index_plane/transfer_error.hpp"

namespace kvstrand::index_plane {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;
using namespace proto;
using common::kAwait;
using common::LogEscaped;

std::error_code status_error(Status s) {
  switch (s) {
    case Status::ok: return {};
    case Status::over_quota: return TransferErrc::tier_full;
    case Status::bad_request:
    case Status::unknown_registration: return TransferErrc::bad_spec;
    case Status::unknown_hold: return TransferErrc::missing_chunk;
    default: return TransferErrc::tier_unavailable;
  }
}

ServerSession::ServerSession(reactor::Reactor& reactor, ServerSessionOptions options,
                             const Registrations& registrations)
    : reactor_(reactor),
      opt_(std::move(options)),
      gate_(reactor.strand()),
      regs_(registrations),
      calls_(
          reactor.strand(), gate_, [this](const Reply& r) { late_reply(r); },
          [this](const std::string& why) { connection_lost(why); }),
      connect_ended_(reactor.strand()),
      pinning_(reactor.strand(), gate_, opt_.device) {}

ServerSession::~ServerSession() = default;

IndexPlane::ServerLink ServerSession::link() const {
  IndexPlane::ServerLink l;
  l.mapped = arena_mapped_;
  l.kept = arena_kept_;
  l.reconnects = reconnects_;
  l.turned_away = turned_away_;
  l.connect_attempts = connect_attempts_;
  l.refusals = refusals_;
  l.arena_bytes = arena_ ? arena_->bytes() : 0;
  l.pinned_bytes = arena_ ? arena_->pinned_bytes() : 0;
  return l;
}

asio::awaitable<void> ServerSession::close() {
  if (connected_) {
    Request req = EndSession{};
    co_await calls_.call(std::move(req), Clock::now() + std::chrono::milliseconds(500));
  }
  closed_ = true;
  connect_ended_.notify();
  connected_ = false;  // a close, not a loss
  drop_connection("closed");
  // Nothing more is pinned; what runs (the reader, the writer, a slab being
  // pinned on a helper thread) ends before the session may go.
  pinning_.close("the node tier closed");
  if (!co_await gate_.close(kCloseBound))
    spdlog::warn("kvstrand: node tier: {} coroutine(s) still running {} ms after close", gate_.inside(),
                 kCloseBound.count());
}

asio::awaitable<Failure> ServerSession::attach(std::uint32_t id) {
  refused_.resize(id + 1);
  // The handshake registers every registration; connected, only this one.
  // (One co_await a statement: GCC 12, docs/development.md.)
  Failure r;
  attaching_ = id;
  if (connected_) {
    const Clock::time_point until = Clock::now() + opt_.request_timeout;
    r = co_await register_one(id, until);
  } else {
    r = co_await ensure_connected();
  }
  attaching_.reset();
  if (!r && refused_.back()) r = refused_.back();  // the server answered, and refused it: the engine is told now
  if (!r || r.ec == TransferErrc::tier_unavailable) {
    // Attached, or no server answered (not started yet, restarting): kept,
    // registered when one answers. The tier is a cache: its absence costs
    // hits, never the engine (lookups miss, saves end tier_unavailable).
    if (r) {
      spdlog::debug("kvstrand: node tier: registration {} kept until the server answers", id);
      keep_attaching();
    }
    co_return Failure{};
  }
  refused_.pop_back();
  if (server_regs_.size() > id) server_regs_.resize(id);
  co_return r;
}

asio::awaitable<Failure> ServerSession::ensure_connected() {
  while (connecting_) co_await connect_ended_.wait();  // another coroutine is connecting: its outcome decides
  if (connected_) co_return Failure{};
  // Not before the backoff since the last attempt has passed: requests in
  // between are turned away at once (a miss, a dropped save), not each
  // made to wait for a connect.
  if (Clock::now() < next_attempt_) {
    ++turned_away_;
    co_return down_;
  }
  Failure r = co_await connect_now();
  if (r) {
    ++turned_away_;
    backoff_ = std::min(backoff_ == std::chrono::milliseconds{0} ? kFirstBackoff : backoff_ * 2, kMaxBackoff);
    next_attempt_ = Clock::now() + backoff_;
  }
  co_return r;
}

asio::awaitable<Failure> ServerSession::connect_now() {
  connecting_ = true;
  ++connect_attempts_;
  Failure r = co_await handshake();
  connecting_ = false;
  connect_ended_.notify();
  if (r) {
    // Said once an outage (and at debug each attempt): the words reach the
    // engine in the transfer's reason too.
    spdlog::debug("kvstrand: node tier: {}", r.why);
    if (!down_)
      spdlog::warn("kvstrand: node tier: {}; lookups miss and saves are dropped until it answers (retrying, at "
                   "most every {} ms)", r.why, kMaxBackoff.count());
    drop_connection("connect: " + r.why);
    down_ = r;
  } else {
    if (down_) spdlog::info("kvstrand: node tier: attached to kvstrand-server at {}", opt_.socket);
    down_ = Failure{};
    backoff_ = std::chrono::milliseconds{0};
  }
  co_return r;
}

void ServerSession::keep_attaching() {
  if (closed_ || attaching_in_background_ || regs_.empty()) return;
  attaching_in_background_ = gate_.spawn(attach_in_background(), LogEscaped{"ServerSession attaching"});
}

asio::awaitable<void> ServerSession::attach_in_background() {
  struct Ended {
    bool& running;
    ~Ended() { running = false; }
  } ended{attaching_in_background_};
  // Its own backoff: a request's attempt is not held back by these, and a
  // server back from a restart is attached by whichever comes first.
  std::chrono::milliseconds backoff{0};
  auto attached_or_closed = [this] { return connected_ || closed_; };
  while (!connected_ && !closed_) {
    if (connecting_) {  // a request is connecting: its outcome decides
      co_await connect_ended_.wait();
      continue;
    }
    if (Failure r = co_await connect_now(); !r) break;
    backoff = std::min(backoff == std::chrono::milliseconds{0} ? kFirstBackoff : backoff * 2, kMaxBackoff);
    // Another's attempt may attach it meanwhile; one that fails does not
    // cut this back-off short.
    co_await connect_ended_.wait_until(attached_or_closed, Clock::now() + backoff);
  }
}

asio::awaitable<Failure> ServerSession::usable(std::uint32_t registration) {
  if (Failure r = co_await ensure_connected(); r) co_return r;
  co_return refused_.at(registration);
}

// Hello, before the reader starts: the arena's file descriptor comes with
// the reply's first byte.
asio::awaitable<Failure> ServerSession::hello(Clock::time_point until) {
  const std::shared_ptr<channel::FramedConnection> conn = calls_.connection();
  // A timer bounds the exchange by closing the connection.
  asio::steady_timer guard(reactor_.strand(), until);
  guard.async_wait([weak = std::weak_ptr<channel::FramedConnection>(conn)](const boost::system::error_code& e) {
    if (auto c = weak.lock(); c && !e) c->close();
  });
  conn->send(encode_request(Hello{kMajor, kMinor, "kvstrand RemoteIndex", opt_.reads}, calls_.next_id()));
  int fd = -1;
  channel::ReadFrame f = co_await conn->read(kDefaultMaxBody, &fd);
  struct FdCloser {
    int* fd;
    ~FdCloser() {
      if (*fd >= 0) ::close(*fd);
    }
  } closer{&fd};
  guard.cancel();
  if (f.io) co_return unreachable("no hello reply: " + f.io.message());
  if (f.header != HeaderError::none) co_return unreachable("it does not speak kvstrand protocol " + std::to_string(kMajor));
  auto reply = decode_reply(f.h.type, f.body);
  if (!reply || reply->status != Status::ok || !std::holds_alternative<HelloReply>(reply->payload)) {
    co_return unreachable("it refused the hello: " + (reply ? reply->message : reply.why()));
  }
  const auto& hr = std::get<HelloReply>(reply->payload);
  if (fd < 0) {
    co_return unreachable("its hello reply came without its arena");
  }
  const int arena_fd = std::exchange(fd, -1);
  server_minor_ = hr.minor;
  // The same server again (a connection lost, not a restart): its holds
  // and its arena are what they were. A 2.1 server says no id; its arena,
  // a memfd of its own life, says who it is.
  const bool same_life = mapping_ && (hr.server_id != 0 ? hr.server_id == server_id_ : mapping_->is_file(arena_fd));
  if (same_life) {
    ::close(arena_fd);
    co_return Failure{};
  }
  server_id_ = hr.server_id;
  if (mapping_ && mapping_->is_file(arena_fd)) {
    // A server restarted on the named arena this process has mapped and
    // pinned (--arena-path): kept as it is, pinning included.
    ::close(arena_fd);
    ++arena_kept_;
  } else {
    auto mapping = ArenaMapping::map(arena_fd, hr.arena_bytes, hr.slab_bytes, server_uid_, !opt_.reads.empty());
    if (!mapping) {
      co_return unreachable("its arena cannot be mapped: " + mapping.why());
    }
    // The old arena, unless a hold still names it, goes here: unpinning and
    // unmapping tens of GiB takes seconds (7.8 s for 40 GiB on the H200),
    // which the strand must not wait for. On a pinning thread instead.
    pinning_.post([old = std::exchange(mapping_, std::move(*mapping)), life = std::move(arena_)]() mutable {
      life.reset();
      old.reset();
    });
    ++arena_mapped_;
    pinning_.start(mapping_.get());
  }
  // This server life's token: an alias of the mapping (arena_-> is the
  // mapping) with an owner of its own, so that holds of an earlier life
  // are told apart (current()) even when the mapping is the same.
  arena_ = std::shared_ptr<ArenaMapping>(std::make_shared<std::shared_ptr<ArenaMapping>>(mapping_), mapping_.get());
  // Pin the whole arena in the background (pages the server has not
  // populated yet are allocated by the first toucher, this process or the
  // server); a copy waits only for its own slab's prefix.
  gate_.spawn(pinning_.up_to(arena_, arena_->bytes()), LogEscaped{"ServerSession pinning"});
  co_return Failure{};
}

asio::awaitable<Failure> ServerSession::handshake() {
  if (regs_.empty()) co_return Failure{TransferErrc::not_registered, "no layout registered"};
  ++connections_;
  local::socket sock(reactor_.strand());
  auto [cec] = co_await sock.async_connect(local::endpoint(opt_.socket), kAwait);
  if (cec) co_return unreachable("connect: " + cec.message());
  // Whoever listens at the path gets every save's bytes and serves its own
  // as hits: only a server run by this process's user, root, or the uid the
  // options name is spoken to (a user who bound a shared path first is not).
  ucred peer{};
  socklen_t len = sizeof peer;
  if (::getsockopt(sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0)
    co_return unreachable(std::string("SO_PEERCRED: ") + std::strerror(errno));
  if (peer.uid != ::geteuid() && peer.uid != 0 && static_cast<std::int64_t>(peer.uid) != opt_.server_uid)
    co_return unreachable("it is run by uid " + std::to_string(peer.uid) + ", neither this process's user (uid " +
                          std::to_string(::geteuid()) +
                          "), root, nor server_uid: not trusted with the KV (put the socket in a directory only "
                          "the service's user can write, e.g. /run/kvstrand, or set server_uid)");
  server_uid_ = peer.uid;
  calls_.open(std::move(sock));
  const auto until = Clock::now() + opt_.request_timeout;
  if (Failure r = co_await hello(until); r) co_return r;
  if (!calls_.read_replies())
    co_return Failure{TransferErrc::tier_unavailable, "the node tier is closing"};
  server_regs_.clear();
  for (std::size_t i = 0; i < regs_.size(); ++i)
    if (Failure r = co_await register_one(i, until); r) co_return r;  // no answer: the connection is no use
  if (connections_ > 1) ++reconnects_;
  connected_ = true;
  // Holds whose release could not be sent: the same server may still have
  // them; a restarted one does not, and its own holds may have their ids.
  for (auto& [hold, of] : std::exchange(unsent_releases_, {}))
    if (current(of)) calls_.send_only(Release{hold});
  co_return Failure{};
}

Failure ServerSession::unreachable(const std::string& why) const {
  return Failure{TransferErrc::tier_unavailable, "kvstrand-server at " + opt_.socket + ": " + why};
}

asio::awaitable<Failure> ServerSession::register_one(std::size_t i, Clock::time_point until) {
  // Requests and results are named variables (GCC 12, docs/development.md).
  kv::Layout sent = regs_.at(static_cast<std::uint32_t>(i)).layout;
  // A 2.3 server refuses bytes after the layout. Its keys still keep the
  // tenant apart (the name is in their namespace); only its quota is lost.
  if (server_minor_ < 4 && !sent.tenant.empty()) {
    if (!warned_tenant_)
      spdlog::warn("kvstrand: node tier: kvstrand-server at {} speaks protocol 2.{}: tenant '{}' is not told to it "
                   "(no --tenant-quota applies; keys stay the tenant's own)",
                   opt_.socket, server_minor_, sent.tenant);
    warned_tenant_ = true;
    sent.tenant.clear();
  }
  // A 2.4 server refuses bytes after the tenant, and checks no namespace.
  if (server_minor_ < 5) sent.weight_version.clear();
  Request reg_req = RegisterLayout{std::move(sent)};
  std::pair<std::error_code, Reply> reg = co_await calls_.call(std::move(reg_req), until);
  if (reg.first) co_return unreachable("no answer to registration " + std::to_string(i) + ": " + reg.first.message());
  server_regs_.resize(i + 1);
  server_regs_[i] = 0;
  Failure refusal;
  if (reg.second.status != Status::ok) {  // the server's own words: which option differs
    refusal = Failure{status_error(reg.second.status), "kvstrand-server at " + opt_.socket + " refused registration " +
                                                       std::to_string(i) + ": " + reg.second.message};
    if (refusal.ec == TransferErrc::tier_unavailable) refusal.ec = TransferErrc::bad_spec;  // it answered
  } else if (const auto& rr = std::get<RegisterReply>(reg.second.payload); rr.object_bytes != regs_.at(static_cast<std::uint32_t>(i)).object_bytes()) {
    refusal = Failure{TransferErrc::bad_spec, "kvstrand-server at " + opt_.socket + " stores registration " +
                                                  std::to_string(i) + "'s objects in " +
                                                  std::to_string(rr.object_bytes) + " B, its layout in " +
                                                  std::to_string(regs_.at(static_cast<std::uint32_t>(i)).object_bytes()) + " B"};
  } else {
    server_regs_[i] = rr.registration;
  }
  // A refusal is this registration's alone: the others attach, and this
  // one's lookups miss and saves fail until a server takes it (a later
  // connection asks again). Said once per refusal, as an error.
  if (refusal && refusal.why != refused_[i].why && attaching_ != i) {
    spdlog::error("kvstrand: node tier: {}; that registration runs without the tier", refusal.why);
    ++refusals_;
  }
  refused_[i] = std::move(refusal);
  co_return Failure{};
}

void ServerSession::drop_connection(const std::string& why) {
  calls_.end(why);
  connection_lost(why);
}

void ServerSession::connection_lost(const std::string& why) {
  const bool lost = connected_;
  if (lost) spdlog::warn("kvstrand: node tier: connection to {} lost: {}", opt_.socket, why);
  connected_ = false;
  // A server that went away may come back (restarted): attach again then,
  // whether or not the engine asks for anything meanwhile.
  if (lost) keep_attaching();
}

void ServerSession::late_reply(const Reply& r) {
  if (const auto* l = std::get_if<LookupReply>(&r.payload)) release_hold(l->lease, arena_);
  if (const auto* v = std::get_if<ReserveReply>(&r.payload)) release_hold(v->reservation, arena_);
}

void ServerSession::release_hold(std::uint64_t hold, const std::shared_ptr<ArenaMapping>& of) {
  if (hold == 0) return;
  if (!connected_) {
    unsent_releases_.emplace_back(hold, of);
  } else if (current(of)) {
    calls_.send_only(Release{hold});
  }
}

bool ServerSession::current(const std::shared_ptr<void>& arena) const {
  // One owner per server life (see hello()): the same owner, the same life.
  return arena && arena_ && !arena.owner_before(arena_) && !arena_.owner_before(arena);
}

}  // namespace kvstrand::index_plane
