#include "reactor/log_escaped.hpp"
#include "reactor/node_tier.hpp"

#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstring>

#include "hip/device.hpp"
#include <kvstrand/chunk_keys.hpp>
#include "reactor/copy_and_wait.hpp"
#include "reactor/transfer_error.hpp"
#include "tier/fd_passing.hpp"

namespace kvstrand::reactor {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;
using namespace kv::proto;

namespace {
const auto kAwait = asio::as_tuple(asio::use_awaitable);  // awaited ops complete with error codes

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

struct PinResult {
  hip::Status status;
  std::optional<hip::HostRegistration> reg;
};
}  // namespace

// A request waiting for its reply. The timer is the signal: cancelled when
// the reply (or the connection's failure) arrives, expiring at the timeout.
struct NodeTier::Pending {
  Pending(Strand& s, Type t) : signal(s), type(t) {}
  asio::steady_timer signal;
  Type type;
  std::optional<Reply> reply;
  std::error_code failure;
  std::string why;  // with failure: the cause (the connection's loss)
};

NodeTier::NodeTier(Reactor& reactor, NodeTierOptions options) : reactor_(reactor), opt_(std::move(options)) {}

NodeTier::~NodeTier() {
  if (sock_) {
    boost::system::error_code ignored;
    sock_->close(ignored);
  }
  pinner_.join();
  if (!kept_.empty()) {
    spdlog::warn("kvstrand: NodeTier: {} arena mapping(s) left mapped on purpose: a copy on them was never seen "
                 "complete",
                 kept_.size());
    // Leaked on purpose, reachable from a static: never unmapped in this process.
    static auto* forever = new std::vector<std::shared_ptr<ArenaMapping>>;
    for (auto& m : kept_) forever->push_back(std::move(m));
  }
}

asio::awaitable<Refusal> NodeTier::attach(const Registration& reg) {
  regs_.push_back(&reg);
  if (!save_stream_) {
    auto saves = hip::Stream::create();
    auto loads = hip::Stream::create();
    for (const hip::Status& s : {saves.status(), loads.status()}) {
      if (s.ok()) continue;
      regs_.pop_back();
      co_return Refusal{TransferErrc::device_error, "the node tier's copy streams: " + s.describe()};
    }
    save_stream_.emplace(std::move(saves).value());
    load_stream_.emplace(std::move(loads).value());
  }
  // The handshake registers every registration; connected, only this one.
  // (One co_await a statement: GCC 12 destroys a conditional's awaited
  // temporaries twice.)
  Refusal r;
  if (connected_) {
    const Clock::time_point until = Clock::now() + opt_.request_timeout;
    r = co_await register_one(regs_.size() - 1, until);
  } else {
    r = co_await ensure_connected();
  }
  if (r) {
    regs_.pop_back();
    if (server_regs_.size() > regs_.size()) server_regs_.pop_back();
  }
  co_return r;
}

asio::awaitable<Refusal> NodeTier::ensure_connected() {
  while (connecting_) {  // another coroutine is connecting: wait for its outcome
    asio::steady_timer t(reactor_.strand(), std::chrono::milliseconds(1));
    co_await t.async_wait(kAwait);
  }
  if (connected_) co_return Refusal{};
  connecting_ = true;
  Refusal r = co_await handshake();
  connecting_ = false;
  if (r) {
    // Quiet: the words reach the engine in the refusal or the transfer's reason.
    spdlog::debug("kvstrand: NodeTier: {}", r.why);
    drop_connection("connect: " + r.why);
  }
  co_return r;
}

// Hello, read by hand (before the reader starts) so that the arena's file
// descriptor that comes with the reply's first byte is received.
asio::awaitable<Refusal> NodeTier::hello(Clock::time_point until) {
  // A timer bounds the exchange by closing the socket.
  asio::steady_timer guard(reactor_.strand(), until);
  guard.async_wait([this, gen = generation_](const boost::system::error_code& e) {
    if (!e && gen == generation_ && sock_) {
      boost::system::error_code ignored;
      sock_->close(ignored);
    }
  });
  Request req = Hello{kMajor, kMinor, "kvstrand NodeTier"};
  std::vector<std::byte> frame = encode_request(req, next_id_++);
  auto [wec, wn] = co_await asio::async_write(*sock_, asio::buffer(frame), kAwait);
  if (wec) co_return unreachable("the hello could not be sent: " + wec.message());
  std::array<std::byte, kHeaderBytes> head{};
  std::size_t got = 0;
  int fd = -1;
  while (got < head.size()) {
    auto [ec] = co_await sock_->async_wait(local::socket::wait_read, kAwait);
    if (ec) co_return unreachable("no hello reply: " + ec.message());
    int came = -1;
    const ssize_t n = tier::recv_with_fd(sock_->native_handle(), head.data() + got, head.size() - got, &came,
                                         MSG_DONTWAIT);
    if (n == 0) co_return unreachable("the server closed the connection before its hello reply");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      co_return unreachable(std::string("reading the hello reply: ") + std::strerror(errno));
    }
    if (came >= 0 && fd < 0) {
      fd = came;
    } else if (came >= 0) {
      ::close(came);  // only the first descriptor is the arena
    }
    got += static_cast<std::size_t>(n);
  }
  struct FdCloser {
    int* fd;
    ~FdCloser() {
      if (*fd >= 0) ::close(*fd);
    }
  } closer{&fd};
  Header h;
  if (decode_header(head, kDefaultMaxBody, &h) != HeaderError::none) {
    co_return unreachable("it does not speak kvstrand protocol " + std::to_string(kMajor));
  }
  std::vector<std::byte> body(h.body_bytes);
  auto [rec, rn] = co_await asio::async_read(*sock_, asio::buffer(body), kAwait);
  if (rec) co_return unreachable("reading the hello reply: " + rec.message());
  guard.cancel();
  std::string why;
  auto reply = decode_reply(h.type, body, &why);
  if (!reply || reply->status != Status::ok || !std::holds_alternative<HelloReply>(reply->payload)) {
    co_return unreachable("it refused the hello: " + (reply ? reply->message : why));
  }
  const auto& hr = std::get<HelloReply>(reply->payload);
  if (fd < 0) {
    co_return unreachable("its hello reply came without its arena");
  }
  const int arena_fd = std::exchange(fd, -1);
  auto mapping = ArenaMapping::map(arena_fd, hr.arena_bytes, hr.slab_bytes, &why);
  if (!mapping) {
    co_return unreachable("its arena cannot be mapped: " + why);
  }
  arena_ = std::move(mapping);
  pin_want_ = 0;
  pin_next_ = 0;
  pins_running_ = 0;
  pinning_ = false;
  pin_error_.clear();
  // Pin the whole arena in the background (pages the server has not
  // populated yet are allocated by the first toucher, this process or the
  // server); a copy waits only for its own slab's prefix.
  asio::co_spawn(reactor_.strand(), pinned_up_to(arena_, arena_->bytes()), LogEscaped{"NodeTier pinning"});
  co_return Refusal{};
}

asio::awaitable<Refusal> NodeTier::handshake() {
  if (regs_.empty()) co_return Refusal{TransferErrc::not_registered, "no layout registered"};
  ++generation_;
  sock_.emplace(reactor_.strand());
  auto [cec] = co_await sock_->async_connect(local::endpoint(opt_.socket), kAwait);
  if (cec) co_return unreachable("connect: " + cec.message());
  const auto until = Clock::now() + opt_.request_timeout;
  if (Refusal r = co_await hello(until); r) co_return r;
  asio::co_spawn(reactor_.strand(), read_loop(generation_), ends_connection("NodeTier reader"));
  server_regs_.clear();
  for (std::size_t i = 0; i < regs_.size(); ++i)
    if (Refusal r = co_await register_one(i, until); r) co_return r;
  if (generation_ > 1) ++reconnects_;
  connected_ = true;
  // Holds whose release could not be sent: the same server may still have them.
  for (std::uint64_t hold : std::exchange(unsent_releases_, {})) send_only(Release{hold});
  co_return Refusal{};
}

Refusal NodeTier::unreachable(const std::string& why) const {
  return Refusal{TransferErrc::tier_unavailable, "kvstrand-server at " + opt_.socket + ": " + why};
}

asio::awaitable<Refusal> NodeTier::register_one(std::size_t i, Clock::time_point until) {
  // GCC 12 destroys twice the non-trivial temporaries of a co_await
  // expression: requests and results are named variables here.
  Request reg_req = RegisterLayout{regs_[i]->layout};
  std::pair<std::error_code, Reply> reg = co_await call(std::move(reg_req), until);
  if (reg.first) co_return unreachable("no answer to registration " + std::to_string(i) + ": " + reg.first.message());
  if (reg.second.status != Status::ok)  // the server's own words: which option differs
    co_return Refusal{to_error(reg.second.status), "kvstrand-server at " + opt_.socket + " refused registration " +
                                                       std::to_string(i) + ": " + reg.second.message};
  const auto& rr = std::get<RegisterReply>(reg.second.payload);
  if (rr.object_bytes != regs_[i]->object_bytes())
    co_return Refusal{TransferErrc::bad_spec, "kvstrand-server at " + opt_.socket + " stores registration " +
                                                  std::to_string(i) + "'s objects in " +
                                                  std::to_string(rr.object_bytes) + " B, its layout in " +
                                                  std::to_string(regs_[i]->object_bytes()) + " B"};
  server_regs_.resize(i + 1);
  server_regs_[i] = rr.registration;
  co_return Refusal{};
}

// A reader or writer ended by an exception: its connection can no longer
// be trusted, so it is dropped, and every request on it fails with why.
std::function<void(std::exception_ptr)> NodeTier::ends_connection(const char* what) {
  return [this, what, generation = generation_](std::exception_ptr e) {
    if (!e) return;
    LogEscaped{what}(e);
    if (generation == generation_) drop_connection(std::string(what) + " ended by an exception");
  };
}

void NodeTier::drop_connection(const std::string& why) {
  if (sock_) {
    boost::system::error_code ignored;
    sock_->close(ignored);
  }
  if (connected_) spdlog::warn("kvstrand: NodeTier: connection to {} lost: {}", opt_.socket, why);
  connected_ = false;
  outbox_.clear();
  abandoned_.clear();
  auto waiting = std::exchange(pending_, {});
  for (auto& [id, p] : waiting) {
    p->failure = TransferErrc::tier_unavailable;
    p->why = "the connection was lost: " + why;
    p->signal.cancel();
  }
}

asio::awaitable<std::pair<std::error_code, Reply>> NodeTier::call(Request req, Clock::time_point until) {
  if (!sock_ || !sock_->is_open()) co_return std::pair{std::error_code(TransferErrc::tier_unavailable), Reply{}};
  const std::uint64_t id = next_id_++;
  auto p = std::make_shared<Pending>(reactor_.strand(), type_of(req));
  p->signal.expires_at(until);
  pending_[id] = p;
  outbox_.push_back(encode_request(req, id));
  if (!writing_) {
    writing_ = true;
    asio::co_spawn(reactor_.strand(), write_loop(generation_), ends_connection("NodeTier writer"));
  }
  co_await p->signal.async_wait(kAwait);  // cancelled by the reply, or expired
  pending_.erase(id);
  if (p->reply) co_return std::pair{std::error_code{}, std::move(*p->reply)};
  if (p->failure) co_return std::pair{p->failure, Reply{Status::ok, p->why, Empty{}}};
  // Timed out: what a later reply grants is released when it comes.
  if (connected_) abandoned_[id] = p->type;
  co_return std::pair{std::error_code(TransferErrc::tier_unavailable), Reply{}};
}

void NodeTier::send_only(Request req) {
  if (!connected_ || !sock_ || !sock_->is_open()) return;
  outbox_.push_back(encode_request(req, next_id_++));
  if (!writing_) {
    writing_ = true;
    asio::co_spawn(reactor_.strand(), write_loop(generation_), ends_connection("NodeTier writer"));
  }
}

void NodeTier::release_hold(std::uint64_t hold) {
  if (hold == 0) return;
  if (connected_) {
    send_only(Release{hold});
  } else {
    unsent_releases_.push_back(hold);
  }
}

asio::awaitable<void> NodeTier::write_loop(std::uint64_t generation) {
  while (!outbox_.empty() && generation == generation_ && sock_) {
    auto [ec, n] = co_await asio::async_write(*sock_, asio::buffer(outbox_.front()), kAwait);
    if (generation != generation_) break;
    if (ec) {
      drop_connection("write: " + ec.message());
      break;
    }
    outbox_.pop_front();
  }
  writing_ = false;
}

asio::awaitable<void> NodeTier::read_loop(std::uint64_t generation) {
  std::array<std::byte, kHeaderBytes> head{};
  for (;;) {
    auto [ec, n] = co_await asio::async_read(*sock_, asio::buffer(head), kAwait);
    if (generation != generation_) co_return;
    if (ec) {
      drop_connection("read: " + ec.message());
      co_return;
    }
    Header h;
    if (decode_header(head, kDefaultMaxBody, &h) != HeaderError::none) {
      drop_connection("a frame that is not kvstrand protocol " + std::to_string(kMajor));
      co_return;
    }
    std::vector<std::byte> body(h.body_bytes);
    auto [ec2, n2] = co_await asio::async_read(*sock_, asio::buffer(body), kAwait);
    if (generation != generation_) co_return;
    if (ec2) {
      drop_connection("read: " + ec2.message());
      co_return;
    }
    std::string why;
    auto reply = decode_reply(h.type, body, &why);
    if (reply && reply->status == Status::ok) {
      if (auto a = abandoned_.find(h.request_id); a != abandoned_.end()) {
        abandoned_.erase(a);
        if (auto* l = std::get_if<LookupReply>(&reply->payload)) release_hold(l->lease);
        if (auto* r = std::get_if<ReserveReply>(&reply->payload)) release_hold(r->reservation);
        continue;
      }
    }
    auto it = pending_.find(h.request_id);
    if (it == pending_.end()) continue;  // a release's reply, or a caller that gave up
    if (static_cast<Type>(h.type & ~kReplyBit) != it->second->type) {
      // A reply that does not answer its request: nothing after it on this
      // stream can be trusted. Every request on it fails with the cause.
      drop_connection("protocol error: a " + std::string(to_string(static_cast<Type>(h.type & ~kReplyBit))) +
                      " reply to " + to_string(it->second->type) + " request " + std::to_string(h.request_id));
      co_return;
    }
    if (!reply) {
      it->second->failure = TransferErrc::tier_unavailable;
      spdlog::error("kvstrand: NodeTier: malformed reply: {}", why);
    } else if (reply->status == Status::ok && reply->payload.index() == 0 &&
               (it->second->type == Type::lookup || it->second->type == Type::adopt || it->second->type == Type::reserve ||
                it->second->type == Type::register_layout || it->second->type == Type::hello)) {
      it->second->failure = TransferErrc::tier_unavailable;  // a reply of another request's type
      spdlog::error("kvstrand: NodeTier: a reply that does not answer its {}", to_string(it->second->type));
    } else {
      it->second->reply = std::move(*reply);
    }
    it->second->signal.cancel();
  }
}

// ---- pinning ----------------------------------------------------------------------

asio::awaitable<std::error_code> NodeTier::pinned_up_to(std::shared_ptr<ArenaMapping> m, std::uint64_t end) {
  end = std::min(end, m->bytes());
  while (m->pinned_bytes() < end) {
    if (m != arena_) co_return TransferErrc::tier_unavailable;  // a server since restarted: no more pinning
    if (!pin_error_.empty()) co_return TransferErrc::device_error;
    pin_want_ = std::max(pin_want_, end);
    if (!pinning_) {
      pinning_ = true;
      pin_progress_.emplace(reactor_.strand(), asio::steady_timer::time_point::max());
      // A pinning loop ended by an exception fails the transfers waiting on it.
      auto escaped = [this](std::exception_ptr e) {
        if (!e) return;
        LogEscaped{"NodeTier pinning"}(e);
        pin_error_ = "the pinning loop ended by an exception";
        pinning_ = false;
        if (pin_progress_) pin_progress_->cancel();
      };
      asio::co_spawn(reactor_.strand(), pin_loop(m), std::move(escaped));
    }
    co_await pin_progress_->async_wait(kAwait);  // cancelled after every slab
  }
  co_return std::error_code{};
}

// Keeps up to kPinThreads slabs pinning at once, in order, until the
// wanted prefix is pinned.
asio::awaitable<void> NodeTier::pin_loop(std::shared_ptr<ArenaMapping> m) {
  const std::uint64_t slab = m->slab_bytes();
  while (m == arena_ && pin_error_.empty() && (m->pinned_bytes() < pin_want_ || pins_running_ > 0)) {
    while (pins_running_ < kPinThreads && pin_next_ < m->slab_count() &&
           static_cast<std::uint64_t>(pin_next_) * slab < pin_want_) {
      ++pins_running_;
      asio::co_spawn(reactor_.strand(), pin_slab(m, pin_next_++), LogEscaped{"NodeTier pinning a slab"});
    }
    co_await pin_progress_->async_wait(kAwait);  // cancelled after every slab
  }
  if (m == arena_) pinning_ = false;
  if (pin_progress_) pin_progress_->cancel();
}

asio::awaitable<void> NodeTier::pin_slab(std::shared_ptr<ArenaMapping> m, std::uint32_t slab) {
  std::byte* at = m->base() + static_cast<std::uint64_t>(slab) * m->slab_bytes();
  const std::uint64_t n = m->slab_bytes();
  const int device = opt_.device;
  // Faulting in and registering take tens of ms a GiB: on a helper thread,
  // never here.
  auto work = [at, n, device]() -> asio::awaitable<PinResult> {
    PinResult r;
    if (hip::Status s = hip::select_device(device); !s.ok()) {
      r.status = s;
      co_return r;
    }
    constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE (Linux 5.14): page tables in one call
    (void)::madvise(at, n, kPopulateWrite);
    auto reg = hip::HostRegistration::register_range(at, n);
    if (reg.ok()) {
      r.reg.emplace(std::move(reg).value());
    } else {
      r.status = reg.status();
    }
    co_return r;
  };
  PinResult r = co_await asio::co_spawn(pinner_.get_executor(), work(), asio::use_awaitable);
  if (r.reg) {
    m->add_pinned(slab, std::move(*r.reg));
  } else if (pin_error_.empty()) {
    pin_error_ = r.status.describe();
    spdlog::error("kvstrand: NodeTier: cannot pin the arena for device {}: {}", device, pin_error_);
  }
  if (m == arena_) --pins_running_;
  if (pin_progress_) {
    pin_progress_->cancel();
    pin_progress_->expires_at(asio::steady_timer::time_point::max());
  }
}

void NodeTier::keep_forever(std::shared_ptr<ArenaMapping> m) {
  if (std::find(kept_.begin(), kept_.end(), m) == kept_.end()) kept_.push_back(std::move(m));
}

// ---- the Tier operations ----------------------------------------------------------

Tier::LookupResult NodeTier::take_lease(std::uint32_t registration, const std::vector<kv::ChunkKey>& keys,
                                        LookupReply& r) {
  const std::uint32_t ct = regs_[registration]->layout.chunk_tokens;
  const std::size_t n = ct ? r.hit.tokens / ct : 0;
  if (r.lease == 0 || n == 0) return LookupResult{r.hit, 0};
  if (n > keys.size() || r.offsets.size() != n) {
    spdlog::error("kvstrand: NodeTier: a lookup reply whose hit does not match its keys; treated as a miss");
    release_hold(r.lease);
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

asio::awaitable<Tier::LookupResult> NodeTier::lookup(std::uint32_t registration, std::vector<kv::ChunkKey> keys) {
  if (Refusal r = co_await ensure_connected(); r) co_return LookupResult{};  // unreachable: a miss, recompute
  Request req = Lookup{server_regs_.at(registration), keys};
  std::pair<std::error_code, Reply> res = co_await call(std::move(req), Clock::now() + opt_.request_timeout);
  if (res.first || res.second.status != Status::ok) co_return LookupResult{};
  co_return take_lease(registration, keys, std::get<LookupReply>(res.second.payload));
}

asio::awaitable<Tier::LookupResult> NodeTier::adopt(std::uint32_t registration, std::uint64_t lease,
                                                   std::vector<kv::ChunkKey> keys) {
  if (Refusal r = co_await ensure_connected(); r) co_return LookupResult{};
  Request req = Adopt{server_regs_.at(registration), lease, keys};
  std::pair<std::error_code, Reply> res = co_await call(std::move(req), Clock::now() + opt_.request_timeout);
  if (res.first) co_return LookupResult{};
  if (res.second.status != Status::ok) {
    spdlog::debug("kvstrand: NodeTier: lease {} not adopted: {}", lease, res.second.message);
    co_return LookupResult{};
  }
  co_return take_lease(registration, keys, std::get<LookupReply>(res.second.payload));
}

asio::awaitable<void> NodeTier::release_lookup(std::uint64_t lease) {
  if (leases_.erase(lease) > 0) release_hold(lease);
  co_return;
}

asio::awaitable<std::error_code> NodeTier::connect_for(Transfer& t) {
  if (connected_) co_return std::error_code{};
  Refusal r = co_await ensure_connected();
  if (r) t.reason = r.why;
  co_return r.ec;
}

asio::awaitable<std::error_code> NodeTier::exchange(Transfer& t, Request req, Reply* out) {
  const char* what = to_string(type_of(req));
  // A little past the deadline: the Connector's own deadline decides first.
  std::pair<std::error_code, Reply> res = co_await call(std::move(req), t.deadline + std::chrono::milliseconds(50));
  if (res.first) {
    t.reason = "kvstrand-server at " + opt_.socket + " did not answer the " + what;
    if (!res.second.message.empty()) t.reason += " (" + res.second.message + ")";
    co_return res.first;
  }
  if (res.second.status != Status::ok) {
    t.reason = std::string(to_string(res.second.status)) + ": " + res.second.message;
    co_return to_error(res.second.status);
  }
  *out = std::move(res.second);
  co_return std::error_code{};
}

asio::awaitable<std::error_code> NodeTier::save(Transfer& t) {
  const Registration& reg = *regs_.at(t.spec.registration);
  if (!kv::writes_to_tier(reg.layout)) co_return std::error_code{};  // rank 0 stores the one copy
  if (std::error_code ec = co_await connect_for(t)) co_return ec;
  const kv::TransferSpec& s = t.spec;
  const std::uint64_t object_bytes = reg.object_bytes();
  Reserve req;
  req.registration = server_regs_.at(t.spec.registration);
  req.keys = s.keys;
  for (std::size_t i = 0; i < s.keys.size(); ++i) req.images.push_back(s.with_state && s.state_slots[i] >= 0);
  std::vector<std::uint8_t> images = req.images;
  Request request = std::move(req);
  Reply reply;
  if (std::error_code ec = co_await exchange(t, std::move(request), &reply)) co_return ec;
  const auto& rr = std::get<ReserveReply>(reply.payload);
  if (rr.chunks.size() != s.keys.size()) {
    release_hold(rr.reservation);
    t.reason = "a reserve reply for " + std::to_string(rr.chunks.size()) + " of " + std::to_string(s.keys.size()) +
               " chunks";
    co_return TransferErrc::tier_unavailable;
  }
  std::shared_ptr<ArenaMapping> arena = arena_;
  std::vector<std::byte*> objects(s.keys.size(), nullptr);
  std::vector<bool> with_image(s.keys.size(), false);
  std::uint32_t refused = 0;
  std::uint64_t end = 0;
  for (std::size_t i = 0; i < s.keys.size(); ++i) {
    switch (rr.chunks[i]) {
      case ChunkState::existed: ++t.chunks_existed; break;  // never rewritten
      case ChunkState::full: ++refused; break;
      case ChunkState::reserved:
        // The server's offsets are checked like any other input: a bad one
        // must not make this process write outside the arena.
        if (!arena->contains(rr.offsets[i], object_bytes)) {
          release_hold(rr.reservation);
          t.reason = "the server reserved offset " + std::to_string(rr.offsets[i]) + ", outside its arena";
          co_return TransferErrc::tier_unavailable;
        }
        objects[i] = arena->base() + rr.offsets[i];
        with_image[i] = images[i] != 0;
        end = std::max(end, rr.offsets[i] + object_bytes);
        break;
    }
  }
  std::error_code ec;
  if (rr.reservation != 0) {
    if ((ec = co_await pinned_up_to(arena, end))) {
      release_hold(rr.reservation);
      t.reason = "the arena could not be pinned: " + pin_error_;
      co_return ec;
    }
    bool copied = true;
    ec = co_await copy_and_wait(reactor_, t, *save_stream_, hip::CopyKind::device_to_host,
                                segments(reg, s, objects, true, with_image), &copied);
    if (!copied) {
      keep_forever(arena);  // the reservation stays held: the copy may still write it
      co_return ec;
    }
    Request commit = Commit{rr.reservation, !ec};
    Reply creply;
    std::error_code cec = co_await exchange(t, std::move(commit), &creply);
    if (!ec && cec) {
      t.reason = "copied, but not committed: " + t.reason;
      ec = cec;
    }
  }
  t.chunks_refused = refused;
  if (!ec && refused > 0) {
    t.reason = std::to_string(refused) + " of " + std::to_string(s.keys.size()) +
               " chunks refused: every object is in use (tier full)";
    ec = TransferErrc::tier_full;
  }
  co_return ec;
}

asio::awaitable<std::error_code> NodeTier::load(Transfer& t) {
  if (std::error_code ec = co_await connect_for(t)) co_return ec;
  const kv::TransferSpec& s = t.spec;
  const Registration& reg = *regs_.at(s.registration);
  const std::uint64_t object_bytes = reg.object_bytes();
  const std::uint32_t ct = reg.layout.chunk_tokens;
  std::uint64_t hold = 0;
  Lease lease;
  if (auto it = leases_.find(s.tier_lease);
      s.tier_lease != 0 && it != leases_.end() && it->second.registration == s.registration) {
    hold = it->first;
    lease = std::move(it->second);
    leases_.erase(it);
  } else {
    // No lease of this process's own lookup: lease exactly the spec's chunks.
    Request req = Lookup{server_regs_.at(s.registration), s.keys};
    Reply reply;
    if (std::error_code ec = co_await exchange(t, std::move(req), &reply)) co_return ec;
    auto& r = std::get<LookupReply>(reply.payload);
    hold = r.lease;
    if (r.offsets.size() * ct != r.hit.tokens || r.hit.tokens / ct > s.keys.size()) {
      release_hold(hold);
      t.reason = "a lookup reply whose hit does not match its keys";
      co_return TransferErrc::tier_unavailable;
    }
    lease.keys.assign(s.keys.begin(), s.keys.begin() + static_cast<std::ptrdiff_t>(r.offsets.size()));
    lease.offsets = std::move(r.offsets);
    lease.checkpoints = std::move(r.hit.checkpoints);
    lease.arena = arena_;
  }
  // Each of the spec's chunks in the lease, and the image at its end.
  std::vector<std::byte*> objects;
  std::uint64_t end = 0;
  std::size_t last = 0;
  for (const kv::ChunkKey& k : s.keys) {
    const auto at = std::find_if(lease.keys.begin(), lease.keys.end(), [&k](const kv::ChunkKey& x) {
      return x.ns == k.ns && x.kv_rank == k.kv_rank && x.hash == k.hash;
    });
    if (at == lease.keys.end()) {
      release_hold(hold);
      t.reason = "the tier no longer holds every chunk of the load";
      co_return TransferErrc::missing_chunk;
    }
    last = static_cast<std::size_t>(at - lease.keys.begin());
    const std::uint64_t off = lease.offsets[last];
    if (!lease.arena || !lease.arena->contains(off, object_bytes)) {
      release_hold(hold);
      t.reason = "the server leased offset " + std::to_string(off) + ", outside its arena";
      co_return TransferErrc::tier_unavailable;
    }
    objects.push_back(lease.arena->base() + off);
    end = std::max(end, off + object_bytes);
  }
  if (s.with_state && std::find(lease.checkpoints.begin(), lease.checkpoints.end(), (last + 1) * ct) ==
                          lease.checkpoints.end()) {
    release_hold(hold);
    t.reason = "no checkpoint image stored at the load's end";
    co_return TransferErrc::missing_chunk;
  }
  if (std::error_code ec = lease.arena->pinned_bytes() >= end ? std::error_code{}
                                                               : co_await pinned_up_to(lease.arena, end)) {
    release_hold(hold);
    t.reason = "the arena could not be pinned" + (pin_error_.empty() ? std::string() : ": " + pin_error_);
    co_return ec;
  }
  std::vector<bool> images(objects.size(), false);
  if (s.with_state) images.back() = true;
  bool copied = true;
  std::error_code ec = co_await copy_and_wait(reactor_, t, *load_stream_, hip::CopyKind::host_to_device,
                                              segments(reg, s, objects, false, images), &copied);
  if (!copied) {
    keep_forever(lease.arena);  // the lease stays held: the copy may still read those objects
    co_return ec;
  }
  release_hold(hold);  // the copy is done: the server is not needed for the outcome
  co_return ec;
}

asio::awaitable<void> NodeTier::drain() {
  if (connected_) {
    // Leases no load named go back with the session's end (best effort: a
    // lost connection leaves them to the process's exit).
    for (auto& [id, l] : std::exchange(leases_, {})) release_hold(id);
    Request req = EndSession{};
    co_await call(std::move(req), Clock::now() + std::chrono::milliseconds(500));
  }
  connected_ = false;  // a close, not a loss
  drop_connection("closed");
}

}  // namespace kvstrand::reactor
