#include "server/tier_server.hpp"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/json.hpp>
#include <deque>
#include <future>
#include <map>
#include <stdexcept>

#include "hip/imported_buffer.hpp"
#include "hip/sim_hooks.hpp"
#include "kv/protocol.hpp"
#include "reactor/debug_http.hpp"
#include "reactor/debug_page.hpp"
#include "reactor/local_tier.hpp"
#include "reactor/metrics.hpp"
#include "reactor/reactor.hpp"
#include "reactor/registration.hpp"
#include "reactor/transfer_error.hpp"

namespace kvstrand::server {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;
using namespace kv::proto;
using Clock = std::chrono::steady_clock;
const auto kAwait = asio::as_tuple(asio::use_awaitable);  // awaited ops complete with error codes

namespace {

// A registration: the geometry and the imported device memory it names. The
// requests in flight on it hold it, so its imports close after their copies.
struct RegState {
  reactor::Registration reg;
  std::vector<hip::ImportedBuffer> imports;
};

struct Session {
  Session(std::uint64_t i, local::socket s) : id(i), sock(std::move(s)), last_request(Clock::now()) {}
  std::uint64_t id;
  local::socket sock;
  pid_t pid = 0;
  bool hello = false;
  bool closed = false;
  bool close_after_flush = false;
  bool writing = false;
  std::deque<std::vector<std::byte>> outbox;
  std::map<std::uint32_t, std::shared_ptr<RegState>> regs;
  Clock::time_point last_request;
};

struct LookupLock {
  std::uint64_t session = 0;
  std::vector<kv::ChunkKey> keys;
  Clock::time_point expiry;
};

Reply fail(Status s, std::string message) { return Reply{s, std::move(message), Empty{}}; }

}  // namespace

using HttpRoutes_t = reactor::HttpRoutes;

struct TierServer::Impl {
  explicit Impl(ServerOptions o)
      : opt(std::move(o)), reactor(reactor::ReactorOptions{.device = opt.device}),
        tier(std::make_unique<reactor::LocalTier>(reactor, opt.tier_bytes)) {}

  // ---- start and stop -------------------------------------------------------

  asio::awaitable<std::string> listen() {
    const local::endpoint ep(opt.socket);
    {
      local::socket probe(reactor.strand());
      boost::system::error_code ec;
      probe.connect(ep, ec);  // start-up only: a local connect answers at once
      if (!ec) co_return "--socket " + opt.socket + ": another server is already listening there";
    }
    ::unlink(opt.socket.c_str());  // a stale socket file from a server that died
    acceptor.emplace(reactor.strand());
    boost::system::error_code ec;
    acceptor->open(ep.protocol(), ec);
    const mode_t old = ::umask(0177);  // created 0600: only this user connects
    if (!ec) acceptor->bind(ep, ec);
    ::umask(old);
    if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) co_return "--socket " + opt.socket + ": " + ec.message();
    ::chmod(opt.socket.c_str(), 0600);
    signals.emplace(reactor.strand(), SIGINT, SIGTERM);
    signals->async_wait([this](const boost::system::error_code& e, int sig) {
      if (!e) {
        spdlog::info("kvstrand-server: signal {}, stopping", sig);
        shutdown();
      }
    });
    asio::co_spawn(reactor.strand(), accept_loop(), asio::detached);
    asio::co_spawn(reactor.strand(), sweep_loop(), asio::detached);
    co_return std::string{};
  }

  void shutdown() {
    if (stopping) return;
    stopping = true;
    if (acceptor) acceptor->close();
    if (signals) signals->cancel();
    if (sweep) sweep->cancel();
    auto all = sessions;
    for (auto& [id, s] : all) reap(s, "server stopping");
    stopped.set_value();
  }

  // ---- sessions ---------------------------------------------------------------

  asio::awaitable<void> accept_loop() {
    for (;;) {
      // Named, not a structured binding: GCC 12 destroys non-trivial parts
      // of a bound co_await result twice.
      std::tuple<boost::system::error_code, local::socket> accepted = co_await acceptor->async_accept(kAwait);
      auto& ec = std::get<0>(accepted);
      auto& sock = std::get<1>(accepted);
      if (ec) {
        if (ec == asio::error::operation_aborted || stopping) co_return;
        continue;
      }
      ucred cred{};
      socklen_t len = sizeof cred;
      if (::getsockopt(sock.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::geteuid()) {
        spdlog::warn("kvstrand-server: refused a peer of uid {} (the server runs as uid {})", cred.uid, ::geteuid());
        auto frame = encode_reply(Type::hello, 0, fail(Status::not_authorized, "peer uid is not the server's"));
        co_await asio::async_write(sock, asio::buffer(frame), kAwait);
        continue;
      }
      auto s = std::make_shared<Session>(next_session++, std::move(sock));
      s->pid = cred.pid;
      sessions[s->id] = s;
      spdlog::debug("kvstrand-server: session {} from pid {}", s->id, cred.pid);
      asio::co_spawn(reactor.strand(), serve(s), asio::detached);
    }
  }

  asio::awaitable<void> serve(std::shared_ptr<Session> s) {
    std::array<std::byte, kHeaderBytes> head{};
    std::string end = "client closed the connection";
    while (!s->closed) {
      auto [ec, n] = co_await asio::async_read(s->sock, asio::buffer(head), kAwait);
      if (ec) break;
      Header h;
      const HeaderError he = decode_header(head, opt.max_frame, &h);
      if (he == HeaderError::bad_magic || he == HeaderError::too_large) {
        end = he == HeaderError::bad_magic ? "not a kvstrand frame" : "frame larger than --max-frame";
        break;
      }
      if (he == HeaderError::other_major) {
        send(s, encode_reply(Type::hello, h.request_id,
                             fail(Status::refused_version, "client speaks major version " + std::to_string(h.major) +
                                                               "; this server speaks " + std::to_string(kMajor))));
        s->close_after_flush = true;
        co_return;
      }
      std::vector<std::byte> body(h.body_bytes);
      auto [ec2, n2] = co_await asio::async_read(s->sock, asio::buffer(body), kAwait);
      if (ec2) break;
      s->last_request = Clock::now();
      std::string why;
      auto req = decode_request(h.type, body, &why);
      if (!req) {
        send(s, encode_reply(static_cast<Type>(h.type & ~kReplyBit), h.request_id, fail(Status::bad_request, why)));
        continue;
      }
      if (!s->hello && !std::holds_alternative<Hello>(*req)) {
        send(s, encode_reply(type_of(*req), h.request_id, fail(Status::bad_request, "send hello first")));
        continue;
      }
      // Each request is its own coroutine: a long copy does not stop reads.
      asio::co_spawn(reactor.strand(), handle(s, h.request_id, std::move(*req)), asio::detached);
    }
    reap(s, end);
  }

  void send(const std::shared_ptr<Session>& s, std::vector<std::byte> frame) {
    if (s->closed) return;
    s->outbox.push_back(std::move(frame));
    if (!s->writing) {
      s->writing = true;
      asio::co_spawn(reactor.strand(), writer(s), asio::detached);
    }
  }

  asio::awaitable<void> writer(std::shared_ptr<Session> s) {
    while (!s->outbox.empty() && !s->closed) {
      auto [ec, n] = co_await asio::async_write(s->sock, asio::buffer(s->outbox.front()), kAwait);
      if (ec) {
        reap(s, "write failed: " + ec.message());
        break;
      }
      s->outbox.pop_front();
    }
    s->writing = false;
    if (s->close_after_flush && s->outbox.empty()) reap(s, "closed after its last reply");
  }

  // Frees what the session holds. Its registrations go with it, but each
  // request still copying holds its own reference: imported memory closes
  // only after the last copy on it completed.
  void reap(const std::shared_ptr<Session>& s, const std::string& why) {
    if (s->closed) return;
    s->closed = true;
    boost::system::error_code ignored;
    s->sock.close(ignored);
    for (auto it = locks.begin(); it != locks.end();) {
      if (it->second.session == s->id) {
        tier->store().unpin(it->second.keys);
        it = locks.erase(it);
      } else {
        ++it;
      }
    }
    s->regs.clear();
    s->outbox.clear();
    sessions.erase(s->id);
    spdlog::debug("kvstrand-server: session {} ended: {}", s->id, why);
  }

  asio::awaitable<void> sweep_loop() {
    sweep.emplace(reactor.strand());
    for (;;) {
      sweep->expires_after(std::chrono::milliseconds(250));
      auto [ec] = co_await sweep->async_wait(kAwait);
      if (ec || stopping) co_return;
      const auto now = Clock::now();
      for (auto it = locks.begin(); it != locks.end();) {
        if (it->second.expiry <= now) {
          tier->store().unpin(it->second.keys);  // the exact keys that took it
          it = locks.erase(it);
        } else {
          ++it;
        }
      }
      auto all = sessions;
      for (auto& [id, s] : all)
        if (now - s->last_request > opt.reap_after) reap(s, "idle past --reap-after");
    }
  }

  // ---- requests ---------------------------------------------------------------

  asio::awaitable<void> handle(std::shared_ptr<Session> s, std::uint64_t request_id, Request req) {
    const Type type = type_of(req);
    const auto t0 = Clock::now();
    std::optional<std::map<std::uint64_t, Copy>::iterator> copy;
    if (type == Type::store || type == Type::retrieve) {
      const auto& spec = type == Type::store ? std::get<Store>(req).spec : std::get<Retrieve>(req).spec;
      copy = copies.emplace(next_copy++, Copy{s->id, request_id, type == Type::store ? "store" : "retrieve",
                                              spec.keys.size(), spec.blocks.size(), t0})
                 .first;
    }
    Reply rep = co_await dispatch(s, req);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    ++requests[reactor::labels({{"type", to_string(type)}, {"status", to_string(rep.status)}})];
    if (copy) {
      ((*copy)->second.kind == std::string("store") ? store_seconds : retrieve_seconds).observe(seconds);
      copies.erase(*copy);
    }
    send(s, encode_reply(type, request_id, rep));
    if (type == Type::end_session) s->close_after_flush = true;
  }

  asio::awaitable<Reply> dispatch(std::shared_ptr<Session> s, Request& req) {
    if (std::holds_alternative<Hello>(req)) {
      s->hello = true;
      co_return Reply{Status::ok, "", HelloReply{s->id, kMajor, kMinor}};
    }
    if (auto* m = std::get_if<RegisterLayout>(&req)) co_return register_layout(s, *m);
    if (auto* m = std::get_if<Unregister>(&req)) {
      if (s->regs.erase(m->registration) == 0) co_return fail(Status::unknown_registration, "no such registration");
      co_return Reply{};
    }
    if (auto* m = std::get_if<Lookup>(&req)) co_return lookup(s, *m);
    if (auto* m = std::get_if<FreeLocks>(&req)) {
      release_lock(s->id, m->lock);
      co_return Reply{};
    }
    if (auto* m = std::get_if<Store>(&req)) co_return co_await store(s, *m);
    if (auto* m = std::get_if<Retrieve>(&req)) co_return co_await retrieve(s, *m);
    if (std::holds_alternative<Stats>(req)) co_return stats();
    co_return Reply{};  // end_session, ping
  }

  Reply register_layout(const std::shared_ptr<Session>& s, RegisterLayout& m) {
    const kv::Layout& l = m.layout;
    if (auto err = kv::validate(l)) return fail(Status::bad_request, err->describe());
    if (l.chunk_tokens != opt.chunk_tokens)
      return fail(Status::bad_request, "layout chunk_tokens " + std::to_string(l.chunk_tokens) +
                                           " differs from the server's --chunk-tokens " +
                                           std::to_string(opt.chunk_tokens));
    if (m.planes.size() != l.planes.size())
      return fail(Status::bad_request, std::to_string(m.planes.size()) + " plane handles for " +
                                           std::to_string(l.planes.size()) + " planes");
    auto st = std::make_shared<RegState>();
    st->reg.layout = l;
    std::map<IpcBytes, std::byte*> opened;  // one import per allocation
    auto import = [&](const MemoryHandle& mh, std::uint64_t unit, std::byte** base) -> std::optional<std::string> {
      auto handle = hip::IpcHandle::from_bytes(mh.handle);
      if (!handle) return "malformed IPC handle";
      std::byte* mem = nullptr;
      if (auto it = opened.find(mh.handle); it != opened.end()) {
        mem = it->second;
      } else {
        auto buf = hip::ImportedBuffer::open(*handle);
        if (!buf.ok()) return buf.status().describe();
        mem = buf->data();
        opened[mh.handle] = mem;
        st->imports.push_back(std::move(buf).value());
      }
      if (mh.count == 0 || unit == 0 || mh.offset > handle->bytes || mh.count > (handle->bytes - mh.offset) / unit)
        return "offset " + std::to_string(mh.offset) + " + " + std::to_string(mh.count) + " x " +
               std::to_string(unit) + " B does not fit the " + std::to_string(handle->bytes) + " B allocation";
      *base = mem + mh.offset;
      return std::nullopt;
    };
    for (std::size_t p = 0; p < l.planes.size(); ++p) {
      std::byte* base = nullptr;
      if (auto e = import(m.planes[p], l.planes[p].bytes_per_block, &base))
        return fail(Status::out_of_range, "plane '" + l.planes[p].name + "': " + *e);
      st->reg.planes.push_back({base, m.planes[p].count});
    }
    if (l.has_state()) {
      std::byte* base = nullptr;
      if (auto e = import(m.state, l.checkpoint.image_bytes, &base))
        return fail(Status::out_of_range, "state memory: " + *e);
      st->reg.state = {base, m.state.count};
    }
    if (auto e = st->reg.check()) return fail(Status::bad_request, *e);
    if (std::error_code ec = tier->attach_now(st->reg))
      return fail(Status::bad_request, "this layout's objects (" + std::to_string(st->reg.object_bytes()) +
                                           " B) do not fit the tier's (" + ec.message() + ")");
    if (opt.sim_copy_delay.count() > 0) {  // the streams exist once the tier is attached
      const std::chrono::microseconds d = opt.sim_copy_delay;
      (void)hip::sim::set_stream_delay(tier->save_stream(), d);
      (void)hip::sim::set_stream_delay(tier->load_stream(), d);
    }
    const std::uint32_t id = next_reg++;
    s->regs[id] = st;
    return Reply{Status::ok, "", RegisterReply{id}};
  }

  std::shared_ptr<RegState> registration(const std::shared_ptr<Session>& s, std::uint32_t id) {
    auto it = s->regs.find(id);
    return it == s->regs.end() ? nullptr : it->second;
  }

  Reply lookup(const std::shared_ptr<Session>& s, const Lookup& m) {
    auto st = registration(s, m.registration);
    if (!st) return fail(Status::unknown_registration, "no such registration");
    LookupReply r;
    r.hit = tier->lookup(m.keys, st->reg.layout.chunk_tokens);
    const std::size_t n = r.hit.tokens / st->reg.layout.chunk_tokens;
    if (n > 0) {
      std::vector<kv::ChunkKey> held(m.keys.begin(), m.keys.begin() + static_cast<std::ptrdiff_t>(n));
      if (tier->store().pin(held)) {
        r.lock = next_lock++;
        locks[r.lock] = LookupLock{s->id, std::move(held), Clock::now() + opt.lock_ttl};
      }
    }
    return Reply{Status::ok, "", r};
  }

  void release_lock(std::uint64_t session, std::uint64_t lock) {
    auto it = locks.find(lock);
    if (it == locks.end() || it->second.session != session) return;
    tier->store().unpin(it->second.keys);
    locks.erase(it);
  }

  asio::awaitable<Reply> store(std::shared_ptr<Session> s, Store& m) {
    auto st = registration(s, m.registration);  // held until the copy completed
    if (!st) co_return fail(Status::unknown_registration, "no such registration");
    if (auto e = st->reg.check_save(m.spec)) co_return fail(Status::out_of_range, *e);
    reactor::Transfer t;
    t.kind = reactor::TransferKind::save;
    t.spec = std::move(m.spec);
    std::error_code ec = co_await tier->save(st->reg, t);
    const auto keys = static_cast<std::uint32_t>(t.spec.keys.size());
    if (ec == reactor::TransferErrc::tier_full) co_return fail(Status::tier_full, t.reason);
    if (ec) co_return fail(Status::device_error, t.reason.empty() ? ec.message() : t.reason);
    co_return Reply{Status::ok, "", StoreReply{keys - t.chunks_existed - t.chunks_refused, t.chunks_existed, 0}};
  }

  asio::awaitable<Reply> retrieve(std::shared_ptr<Session> s, Retrieve& m) {
    auto st = registration(s, m.registration);
    if (!st) co_return fail(Status::unknown_registration, "no such registration");
    if (auto e = st->reg.check_load(m.spec)) co_return fail(Status::out_of_range, *e);
    reactor::Transfer t;
    t.kind = reactor::TransferKind::load;
    t.spec = std::move(m.spec);
    std::error_code ec = co_await tier->load(st->reg, t);
    // The lookup's read locks go only now that the copies completed.
    if (m.lock != 0) release_lock(s->id, m.lock);
    if (ec == reactor::TransferErrc::missing_chunk) co_return fail(Status::missing_chunk, t.reason);
    if (ec) co_return fail(Status::device_error, t.reason.empty() ? ec.message() : t.reason);
    co_return Reply{};
  }

  Reply stats() {
    StatsReply r;
    if (tier->attached()) {
      const auto st = tier->store().stats();
      r.capacity_bytes = st.capacity_bytes;
      r.used_bytes = st.used_bytes;
      r.objects = st.objects;
      r.pinned = st.pinned;
      r.evictions = st.evictions;
    } else {
      r.capacity_bytes = opt.tier_bytes;
    }
    r.sessions = sessions.size();
    r.locks = locks.size();
    return Reply{Status::ok, "", r};
  }

  // ---- the debug endpoint (routes run on the strand) -------------------------

  HttpRoutes_t routes() {
    namespace json = boost::json;
    HttpRoutes_t r;
    r["/healthz"] = [this] {
      return reactor::HttpResponse{stopping ? 503u : 200u, "text/plain", stopping ? "stopping\n" : "ok\n"};
    };
    r["/debug/sessions"] = [this] {
      json::array a;
      const auto now = Clock::now();
      for (const auto& [id, s] : sessions) {
        std::size_t in_flight = 0;
        for (const auto& [cid, c] : copies) in_flight += c.session == id;
        a.push_back(json::object{{"session", id},
                                 {"pid", s->pid},
                                 {"hello", s->hello},
                                 {"registrations", s->regs.size()},
                                 {"idle_ms", std::chrono::duration<double, std::milli>(now - s->last_request).count()},
                                 {"replies_queued", s->outbox.size()},
                                 {"copies_in_flight", in_flight}});
      }
      return reactor::HttpResponse{200, "application/json", json::serialize(a)};
    };
    r["/debug/locks"] = [this] {
      json::array a;
      const auto now = Clock::now();
      for (const auto& [id, l] : locks)
        a.push_back(json::object{{"lock", id},
                                 {"session", l.session},
                                 {"chunks", l.keys.size()},
                                 {"expires_in_ms", std::chrono::duration<double, std::milli>(l.expiry - now).count()}});
      return reactor::HttpResponse{200, "application/json", json::serialize(a)};
    };
    r["/debug/copies"] = [this] {
      json::array a;
      const auto now = Clock::now();
      for (const auto& [id, c] : copies)
        a.push_back(json::object{{"session", c.session},
                                 {"request_id", c.request_id},
                                 {"kind", c.kind},
                                 {"chunks", c.chunks},
                                 {"blocks", c.blocks},
                                 {"age_ms", std::chrono::duration<double, std::milli>(now - c.started).count()}});
      return reactor::HttpResponse{200, "application/json", json::serialize(a)};
    };
    r["/debug/tier"] = [this] {
      const auto st = tier->attached() ? tier->store().stats() : kv::ObjectStore::Stats{opt.tier_bytes};
      json::object o{{"capacity_bytes", st.capacity_bytes}, {"used_bytes", st.used_bytes},
                     {"objects", st.objects},               {"locked_objects", st.pinned},
                     {"writing", st.writing},               {"evictions", st.evictions},
                     {"refused_full", st.refused_full},     {"lookup_chunk_hits", st.lookup_hits},
                     {"lookup_misses", st.lookup_misses},   {"lookup_locks", locks.size()}};
      return reactor::HttpResponse{200, "application/json", json::serialize(o)};
    };
    r["/metrics"] = [this] {
      const auto st = tier->attached() ? tier->store().stats() : kv::ObjectStore::Stats{opt.tier_bytes};
      reactor::PromText p;
      p.counter("kvstrand_server_requests_total", "Requests answered, by type and status", requests);
      p.counter("kvstrand_server_evictions_total", "Objects evicted from the tier", st.evictions);
      p.counter("kvstrand_server_refused_full_total", "Chunks refused because the tier was full", st.refused_full);
      p.gauge("kvstrand_server_sessions", "Client sessions open", static_cast<double>(sessions.size()));
      p.gauge("kvstrand_server_lookup_locks", "Lookup read locks held", static_cast<double>(locks.size()));
      p.gauge("kvstrand_server_copies_in_flight", "Stores and retrieves copying", static_cast<double>(copies.size()));
      p.gauge("kvstrand_server_tier_capacity_bytes", "Tier capacity", static_cast<double>(st.capacity_bytes));
      p.gauge("kvstrand_server_tier_used_bytes", "Tier bytes in use", static_cast<double>(st.used_bytes));
      p.gauge("kvstrand_server_tier_objects", "Objects committed", static_cast<double>(st.objects));
      p.histogram("kvstrand_server_store_seconds", "Store requests, received to reply", store_seconds);
      p.histogram("kvstrand_server_retrieve_seconds", "Retrieve requests, received to reply", retrieve_seconds);
      return reactor::HttpResponse{200, "text/plain; version=0.0.4", p.str()};
    };
    const std::string page = reactor::debug_page(
        "kvstrand-server " + opt.socket, {"/debug/sessions", "/debug/locks", "/debug/copies", "/debug/tier"});
    r["/debug"] = [page] { return reactor::HttpResponse{200, "text/html; charset=utf-8", page}; };
    return r;
  }

  // A store or retrieve between its request and its reply.
  struct Copy {
    std::uint64_t session = 0, request_id = 0;
    const char* kind = "";
    std::size_t chunks = 0, blocks = 0;
    Clock::time_point started;
  };

  ServerOptions opt;
  reactor::Reactor reactor;
  std::unique_ptr<reactor::LocalTier> tier;
  std::optional<local::acceptor> acceptor;
  std::optional<asio::signal_set> signals;
  std::optional<asio::steady_timer> sweep;
  std::map<std::uint64_t, std::shared_ptr<Session>> sessions;
  std::map<std::uint64_t, LookupLock> locks;
  std::uint64_t next_session = 1;
  std::uint64_t next_lock = 1;
  std::uint32_t next_reg = 1;
  bool stopping = false;
  std::promise<void> stopped;
  std::map<std::uint64_t, Copy> copies;
  std::uint64_t next_copy = 1;
  reactor::LabeledCounter requests;
  reactor::Histogram store_seconds, retrieve_seconds;
  std::unique_ptr<reactor::DebugHttp> http;
};

TierServer::TierServer(ServerOptions options) : impl_(std::make_shared<Impl>(std::move(options))) {}

TierServer::~TierServer() {
  stop();
  if (impl_->http) impl_->http->stop();
  impl_->reactor.stop();  // joins the reactor thread; then nothing runs on the tier
  impl_->tier.reset();
}

void TierServer::start() {
  std::string err = impl_->reactor.call([this] { return impl_->listen(); });
  if (!err.empty()) throw std::runtime_error(err);
  if (impl_->opt.http) {
    try {
      impl_->http = std::make_unique<reactor::DebugHttp>(impl_->reactor, *impl_->opt.http, impl_->routes());
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(std::string("--http: ") + e.what());
    }
  }
}

std::uint16_t TierServer::http_port() const { return impl_->http ? impl_->http->port() : 0; }

void TierServer::wait() { impl_->stopped.get_future().wait(); }

void TierServer::stop() {
  impl_->reactor.call([this]() -> asio::awaitable<void> {
    impl_->shutdown();
    co_return;
  });
}

}  // namespace kvstrand::server
