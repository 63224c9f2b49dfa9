#include "common/log_escaped.hpp"
#include "reactor/remote_index.hpp"

#include "common/await_codes.hpp"

#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "hip/device.hpp"
#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/namespace_id.hpp>
#include "reactor/transfer_error.hpp"

namespace kvstrand::reactor {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;
using namespace proto;
using common::LogEscaped;

namespace {
using common::kAwait;

std::error_code to_error(Status s) {
  switch (s) {
    case Status::ok: return {};
    case Status::over_quota: return TransferErrc::tier_full;
    case Status::bad_request:
    case Status::unknown_registration: return TransferErrc::bad_spec;
    case Status::unknown_hold: return TransferErrc::missing_chunk;
    default: return TransferErrc::tier_unavailable;
  }
}

}  // namespace

RemoteIndex::RemoteIndex(Reactor& reactor, NodeTierOptions options)
    : reactor_(reactor), opt_(std::move(options)), gate_(reactor.strand()),
      calls_(reactor.strand(), gate_, [this](const Reply& r) { late_reply(r); },
             [this](const std::string& why) { connection_lost(why); }),
      retry_(reactor.strand()), pinning_(reactor.strand(), gate_, opt_.device) {}

IndexPlane::ServerLink RemoteIndex::server_link() const {
  ServerLink l;
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

RemoteIndex::~RemoteIndex() = default;

asio::awaitable<Failure> RemoteIndex::attach(const Registration& reg) {
  regs_.push_back(&reg);
  refused_.emplace_back();
  // The handshake registers every registration; connected, only this one.
  // (One co_await a statement: GCC 12 destroys a conditional's awaited
  // temporaries twice.)
  Failure r;
  attaching_ = regs_.size() - 1;
  if (connected_) {
    const Clock::time_point until = Clock::now() + opt_.request_timeout;
    r = co_await register_one(regs_.size() - 1, until);
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
      spdlog::debug("kvstrand: node tier: registration {} kept until the server answers", regs_.size() - 1);
      keep_attaching();
    }
    co_return Failure{};
  }
  regs_.pop_back();
  refused_.pop_back();
  if (server_regs_.size() > regs_.size()) server_regs_.pop_back();
  co_return r;
}

asio::awaitable<Failure> RemoteIndex::ensure_connected() {
  while (connecting_) {  // another coroutine is connecting: wait for its outcome
    asio::steady_timer t(reactor_.strand(), std::chrono::milliseconds(1));
    co_await t.async_wait(kAwait);
  }
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

asio::awaitable<Failure> RemoteIndex::connect_now() {
  connecting_ = true;
  ++connect_attempts_;
  Failure r = co_await handshake();
  connecting_ = false;
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

void RemoteIndex::keep_attaching() {
  if (closed_ || attaching_in_background_ || regs_.empty()) return;
  attaching_in_background_ = gate_.spawn(attach_in_background(), LogEscaped{"RemoteIndex attaching"});
}

asio::awaitable<void> RemoteIndex::attach_in_background() {
  struct Ended {
    bool& running;
    ~Ended() { running = false; }
  } ended{attaching_in_background_};
  // Its own backoff: a request's attempt is not held back by these, and a
  // server back from a restart is attached by whichever comes first.
  std::chrono::milliseconds backoff{0};
  while (!connected_ && !closed_) {
    if (connecting_) {  // a request is connecting: its outcome decides
      retry_.expires_after(std::chrono::milliseconds(1));
    } else {
      if (Failure r = co_await connect_now(); !r) break;
      backoff = std::min(backoff == std::chrono::milliseconds{0} ? kFirstBackoff : backoff * 2, kMaxBackoff);
      retry_.expires_after(backoff);
    }
    if (closed_) break;
    co_await retry_.async_wait(kAwait);  // cancelled by drain()
  }
}

asio::awaitable<Failure> RemoteIndex::usable(std::uint32_t registration) {
  if (Failure r = co_await ensure_connected(); r) co_return r;
  co_return refused_.at(registration);
}

// Hello, before the reader starts: the arena's file descriptor comes with
// the reply's first byte.
asio::awaitable<Failure> RemoteIndex::hello(Clock::time_point until) {
  const std::shared_ptr<common::FramedConnection> conn = calls_.connection();
  // A timer bounds the exchange by closing the connection.
  asio::steady_timer guard(reactor_.strand(), until);
  guard.async_wait([weak = std::weak_ptr<common::FramedConnection>(conn)](const boost::system::error_code& e) {
    if (auto c = weak.lock(); c && !e) c->close();
  });
  conn->send(encode_request(Hello{kMajor, kMinor, "kvstrand RemoteIndex"}, calls_.next_id()));
  int fd = -1;
  common::ReadFrame f = co_await conn->read(kDefaultMaxBody, &fd);
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
    auto mapping = ArenaMapping::map(arena_fd, hr.arena_bytes, hr.slab_bytes);
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
  gate_.spawn(pinning_.up_to(arena_, arena_->bytes()), LogEscaped{"RemoteIndex pinning"});
  co_return Failure{};
}

asio::awaitable<Failure> RemoteIndex::handshake() {
  if (regs_.empty()) co_return Failure{TransferErrc::not_registered, "no layout registered"};
  ++connections_;
  local::socket sock(reactor_.strand());
  auto [cec] = co_await sock.async_connect(local::endpoint(opt_.socket), kAwait);
  if (cec) co_return unreachable("connect: " + cec.message());
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

Failure RemoteIndex::unreachable(const std::string& why) const {
  return Failure{TransferErrc::tier_unavailable, "kvstrand-server at " + opt_.socket + ": " + why};
}

asio::awaitable<Failure> RemoteIndex::register_one(std::size_t i, Clock::time_point until) {
  // GCC 12 destroys twice the non-trivial temporaries of a co_await
  // expression: requests and results are named variables here.
  kv::Layout sent = regs_[i]->layout;
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
  Request reg_req = RegisterLayout{std::move(sent)};
  std::pair<std::error_code, Reply> reg = co_await calls_.call(std::move(reg_req), until);
  if (reg.first) co_return unreachable("no answer to registration " + std::to_string(i) + ": " + reg.first.message());
  server_regs_.resize(i + 1);
  server_regs_[i] = 0;
  Failure refusal;
  if (reg.second.status != Status::ok) {  // the server's own words: which option differs
    refusal = Failure{to_error(reg.second.status), "kvstrand-server at " + opt_.socket + " refused registration " +
                                                       std::to_string(i) + ": " + reg.second.message};
    if (refusal.ec == TransferErrc::tier_unavailable) refusal.ec = TransferErrc::bad_spec;  // it answered
  } else if (const auto& rr = std::get<RegisterReply>(reg.second.payload); rr.object_bytes != regs_[i]->object_bytes()) {
    refusal = Failure{TransferErrc::bad_spec, "kvstrand-server at " + opt_.socket + " stores registration " +
                                                  std::to_string(i) + "'s objects in " +
                                                  std::to_string(rr.object_bytes) + " B, its layout in " +
                                                  std::to_string(regs_[i]->object_bytes()) + " B"};
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

void RemoteIndex::drop_connection(const std::string& why) {
  calls_.end(why);
  connection_lost(why);
}

void RemoteIndex::connection_lost(const std::string& why) {
  const bool lost = connected_;
  if (lost) spdlog::warn("kvstrand: node tier: connection to {} lost: {}", opt_.socket, why);
  connected_ = false;
  // A server that went away may come back (restarted): attach again then,
  // whether or not the engine asks for anything meanwhile.
  if (lost) keep_attaching();
}

void RemoteIndex::late_reply(const Reply& r) {
  if (const auto* l = std::get_if<LookupReply>(&r.payload)) release_hold(l->lease, arena_);
  if (const auto* v = std::get_if<ReserveReply>(&r.payload)) release_hold(v->reservation, arena_);
}

void RemoteIndex::release_hold(std::uint64_t hold, const std::shared_ptr<ArenaMapping>& of) {
  if (hold == 0) return;
  if (!connected_) {
    unsent_releases_.emplace_back(hold, of);
  } else if (current(of)) {
    calls_.send_only(Release{hold});
  }
}

bool RemoteIndex::current(const std::shared_ptr<void>& arena) const {
  // One owner per server life (see hello()): the same owner, the same life.
  return arena && arena_ && !arena.owner_before(arena_) && !arena_.owner_before(arena);
}

// ---- the index plane's operations ----------------------------------------------------------

IndexPlane::LookupResult RemoteIndex::take_lease(std::uint32_t registration, const std::vector<kv::ChunkKey>& keys,
                                        LookupReply& r) {
  const std::uint32_t ct = regs_[registration]->layout.chunk_tokens;
  const std::size_t n = ct ? r.hit.tokens / ct : 0;
  if (r.lease == 0 || n == 0) return LookupResult{r.hit, 0};
  if (n > keys.size() || r.offsets.size() != n) {
    spdlog::error("kvstrand: node tier: a lookup reply whose hit does not match its keys; treated as a miss");
    release_hold(r.lease, arena_);
    return LookupResult{};
  }
  Lease l;
  l.registration = registration;
  l.keys.assign(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n));
  l.offsets = r.offsets;
  l.checkpoints = r.hit.checkpoints;
  l.arena = arena_;
  leases_[r.lease] = std::move(l);
  return LookupResult{r.hit, r.lease};
}

asio::awaitable<IndexPlane::LookupResult> RemoteIndex::lookup(std::uint32_t registration, std::vector<kv::ChunkKey> keys) {
  if (Failure r = co_await usable(registration); r) co_return LookupResult{};  // unreachable: a miss, recompute
  Request req = Lookup{server_regs_.at(registration), keys};
  std::pair<std::error_code, Reply> res = co_await calls_.call(std::move(req), Clock::now() + opt_.request_timeout);
  if (res.first || res.second.status != Status::ok) co_return LookupResult{};
  co_return take_lease(registration, keys, std::get<LookupReply>(res.second.payload));
}

asio::awaitable<IndexPlane::LookupResult> RemoteIndex::adopt(std::uint32_t registration, std::uint64_t lease,
                                                   std::vector<kv::ChunkKey> keys) {
  if (Failure r = co_await usable(registration); r) co_return LookupResult{};
  Request req = Adopt{server_regs_.at(registration), lease, keys};
  std::pair<std::error_code, Reply> res = co_await calls_.call(std::move(req), Clock::now() + opt_.request_timeout);
  if (res.first) co_return LookupResult{};
  if (res.second.status != Status::ok) {
    spdlog::debug("kvstrand: node tier: lease {} not adopted: {}", lease, res.second.message);
    co_return LookupResult{};
  }
  co_return take_lease(registration, keys, std::get<LookupReply>(res.second.payload));
}

asio::awaitable<IndexPlane::Dropped> RemoteIndex::drop(std::uint32_t registration) {
  Dropped d;
  if (d.failure = co_await usable(registration); d.failure) co_return d;
  if (server_minor_ < 3) {
    d.failure = Failure{TransferErrc::tier_unavailable,
                        "kvstrand-server at " + opt_.socket + " speaks protocol 2." + std::to_string(server_minor_) +
                            ", and a drop needs 2.3: upgrade the server"};
    co_return d;
  }
  Reply reply;
  d.failure = co_await exchange(Drop{kv::namespace_of(regs_.at(registration)->layout)},
                                Clock::now() + opt_.request_timeout, &reply);
  if (!d.failure) {
    const auto& r = std::get<DropReply>(reply.payload);
    d.objects = r.arena_objects + r.lower_objects;
  }
  co_return d;
}

asio::awaitable<void> RemoteIndex::release_lookup(std::uint64_t lease) {
  if (auto it = leases_.find(lease); it != leases_.end()) {
    release_hold(lease, it->second.arena);
    leases_.erase(it);
  }
  co_return;
}

asio::awaitable<Failure> RemoteIndex::exchange(Request req, Clock::time_point deadline, Reply* out) {
  const char* what = to_string(type_of(req));
  std::pair<std::error_code, Reply> res = co_await calls_.call(std::move(req), deadline);
  if (res.first) {
    std::string why = "kvstrand-server at " + opt_.socket + " did not answer the " + what;
    // Unanswered at the transfer's deadline: that deadline is what ended it,
    // whichever of its timer and this request's ran first.
    if (Clock::now() >= deadline) co_return Failure{TransferErrc::deadline_exceeded, std::move(why) + " by its deadline"};
    if (!res.second.message.empty()) why += " (" + res.second.message + ")";
    co_return Failure{res.first, std::move(why)};
  }
  if (res.second.status != Status::ok)
    co_return Failure{to_error(res.second.status), std::string(to_string(res.second.status)) + ": " +
                                                       res.second.message};
  *out = std::move(res.second);
  co_return Failure{};
}

bool RemoteIndex::stores(std::uint32_t registration) const {
  return kv::writes_to_tier(regs_.at(registration)->layout);
}

asio::awaitable<IndexPlane::Places> RemoteIndex::reserve(std::uint32_t registration,
                                                        const std::vector<kv::ChunkKey>& keys,
                                                        const std::vector<bool>& images,
                                                        const std::vector<std::string>& events,
                                                        Clock::time_point deadline) {
  Places p;
  if ((p.failure = co_await usable(registration))) co_return p;
  const std::uint64_t object_bytes = regs_.at(registration)->object_bytes();
  Reserve req;
  req.registration = server_regs_.at(registration);
  req.keys = keys;
  for (bool image : images) req.images.push_back(image);
  // A 2.3 server refuses bytes after the images: the events are for the
  // server's publisher only, so the save goes on without them.
  if (events.size() == keys.size() && server_minor_ >= 4) req.events = events;
  Request request = std::move(req);
  Reply reply;
  if ((p.failure = co_await exchange(std::move(request), deadline, &reply))) co_return p;
  const auto& rr = std::get<ReserveReply>(reply.payload);
  if (rr.chunks.size() != keys.size()) {
    release_hold(rr.reservation, arena_);
    p.failure = {TransferErrc::tier_unavailable, "a reserve reply for " + std::to_string(rr.chunks.size()) + " of " +
                                                     std::to_string(keys.size()) + " chunks"};
    co_return p;
  }
  std::shared_ptr<ArenaMapping> arena = arena_;
  p.objects.assign(keys.size(), nullptr);
  std::uint64_t end = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    switch (rr.chunks[i]) {
      case ChunkState::existed: break;  // never rewritten
      case ChunkState::full: ++p.refused; break;
      case ChunkState::reserved:
        // The server's offsets are checked like any other input: a bad one
        // must not make this process write outside the arena.
        if (!arena->contains(rr.offsets[i], object_bytes)) {
          release_hold(rr.reservation, arena_);
          p.failure = {TransferErrc::tier_unavailable,
                       "the server reserved offset " + std::to_string(rr.offsets[i]) + ", outside its arena"};
          p.objects.clear();
          co_return p;
        }
        p.objects[i] = arena->base() + rr.offsets[i];
        end = std::max(end, rr.offsets[i] + object_bytes);
        break;
    }
  }
  if (rr.reservation == 0) {  // nothing reserved: nothing to copy or commit
    std::fill(p.objects.begin(), p.objects.end(), nullptr);
    co_return p;
  }
  if (std::error_code ec = co_await pinning_.up_to(arena, end)) {
    release_hold(rr.reservation, arena_);
    p.failure = {ec, "the arena could not be pinned: " + pinning_.error()};
    p.objects.clear();
    co_return p;
  }
  p.hold = rr.reservation;
  p.memory = std::move(arena);
  co_return p;
}

asio::awaitable<Failure> RemoteIndex::commit(std::uint32_t, const std::vector<kv::ChunkKey>&, const Places& places,
                                             bool copied, Clock::time_point deadline) {
  // The reservation's id means something only to the server that granted
  // it: a restarted one may have given it to another process's reservation.
  if (!current(places.memory))
    co_return Failure{TransferErrc::tier_unavailable,
                      "kvstrand-server at " + opt_.socket + " restarted since this save was reserved: not committed"};
  Request commit = Commit{places.hold, copied};
  Reply reply;
  co_return co_await exchange(std::move(commit), deadline, &reply);
}

asio::awaitable<IndexPlane::Held> RemoteIndex::hold(const kv::TransferSpec& s, Clock::time_point deadline) {
  Held h;
  const Registration& reg = *regs_.at(s.registration);
  const std::uint64_t object_bytes = reg.object_bytes();
  const std::uint32_t ct = reg.layout.chunk_tokens;
  Lease lease;
  if (auto it = leases_.find(s.tier_lease);
      s.tier_lease != 0 && it != leases_.end() && it->second.registration == s.registration) {
    // A lease this process holds needs no server: its objects are mapped
    // and stay in place (a server that died meanwhile frees nothing under it).
    h.hold = it->first;
    lease = std::move(it->second);
    leases_.erase(it);
  } else {
    // No lease of this process's own lookup: lease exactly the spec's chunks.
    if ((h.failure = co_await usable(s.registration))) co_return h;
    Request req = Lookup{server_regs_.at(s.registration), s.keys};
    Reply reply;
    if ((h.failure = co_await exchange(std::move(req), deadline, &reply))) co_return h;
    auto& r = std::get<LookupReply>(reply.payload);
    h.hold = r.lease;
    lease.arena = arena_;
    if (r.offsets.size() * ct != r.hit.tokens || r.hit.tokens / ct > s.keys.size()) {
      release_hold(h.hold, lease.arena);
      h.failure = {TransferErrc::tier_unavailable, "a lookup reply whose hit does not match its keys"};
      co_return h;
    }
    lease.keys.assign(s.keys.begin(), s.keys.begin() + static_cast<std::ptrdiff_t>(r.offsets.size()));
    lease.offsets = std::move(r.offsets);
    lease.checkpoints = std::move(r.hit.checkpoints);
  }
  // Each of the spec's chunks in the lease, and whether an image is stored at its end.
  std::uint64_t end = 0;
  std::size_t last = 0;
  for (const kv::ChunkKey& k : s.keys) {
    const auto at = std::find_if(lease.keys.begin(), lease.keys.end(), [&k](const kv::ChunkKey& x) {
      return x.ns == k.ns && x.kv_rank == k.kv_rank && x.hash == k.hash;
    });
    if (at == lease.keys.end()) {
      h.objects.push_back(nullptr);  // the data path says it is missing, and releases the hold
      continue;
    }
    last = static_cast<std::size_t>(at - lease.keys.begin());
    const std::uint64_t off = lease.offsets[last];
    if (!lease.arena || !lease.arena->contains(off, object_bytes)) {
      release_hold(h.hold, lease.arena);
      h.failure = {TransferErrc::tier_unavailable,
                   "the server leased offset " + std::to_string(off) + ", outside its arena"};
      h.objects.clear();
      co_return h;
    }
    h.objects.push_back(lease.arena->base() + off);
    end = std::max(end, off + object_bytes);
  }
  h.image_at_end = std::find(lease.checkpoints.begin(), lease.checkpoints.end(), (last + 1) * ct) !=
                   lease.checkpoints.end();
  const bool whole = std::none_of(h.objects.begin(), h.objects.end(), [](std::byte* p) { return p == nullptr; });
  if (whole && lease.arena->pinned_bytes() < end) {
    if (std::error_code ec = co_await pinning_.up_to(lease.arena, end)) {
      release_hold(h.hold, lease.arena);
      h.failure = {ec, "the arena could not be pinned" + (pinning_.error().empty() ? std::string() : ": " + pinning_.error())};
      h.objects.clear();
      co_return h;
    }
  }
  h.memory = std::move(lease.arena);
  co_return h;
}

void RemoteIndex::release(const kv::TransferSpec&, const Held& held) {
  release_hold(held.hold, std::static_pointer_cast<ArenaMapping>(held.memory));
}

asio::awaitable<void> RemoteIndex::drain() {
  if (connected_) {
    // Leases no load named go back with the session's end (best effort: a
    // lost connection leaves them to the process's exit).
    for (auto& [id, l] : std::exchange(leases_, {})) release_hold(id, l.arena);
    Request req = EndSession{};
    co_await calls_.call(std::move(req), Clock::now() + std::chrono::milliseconds(500));
  }
  closed_ = true;
  retry_.cancel();
  connected_ = false;  // a close, not a loss
  drop_connection("closed");
  // Nothing more is pinned; what runs (the reader, the writer, a slab being
  // pinned on a helper thread) ends before the tier may go.
  pinning_.close("the node tier closed");
  if (!co_await gate_.close(kCloseBound))
    spdlog::warn("kvstrand: node tier: {} coroutine(s) still running {} ms after close", gate_.inside(),
                 kCloseBound.count());
}

}  // namespace kvstrand::reactor
