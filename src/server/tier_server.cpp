#include "common/log_escaped.hpp"
#include "common/await_codes.hpp"
#include "server/tier_server.hpp"
#include "server/debug_routes.hpp"
#include "server/request_service.hpp"
#include "server/session.hpp"

#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <set>
#include <random>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "common/parse_bytes.hpp"
#include "proto/protocol.hpp"
#include "common/accept_backoff.hpp"
#include "common/debug_http.hpp"
#include "common/gate.hpp"
#include "common/metrics.hpp"
#include "common/notifier.hpp"
#include "server/events/event_publisher.hpp"
#include "server/peer_identity.hpp"
#include "server/socket_path.hpp"
#include "server/systemd_notify.hpp"
#include "server/events/tier_events.hpp"
#include "server/arena_host.hpp"
#include "tier/arena.hpp"
#include "tier/object_table.hpp"
#include "tier/index.hpp"
#include "tier/size_classes.hpp"


namespace kvstrand::server {

namespace asio = boost::asio;
using local = asio::local::stream_protocol;
using namespace proto;
using Clock = std::chrono::steady_clock;
using common::Strand;

namespace {

using common::kAwait;

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

}  // namespace

struct TierServer::Impl {
  explicit Impl(ServerOptions o) : opt(std::move(o)), work(ctx.get_executor()), strand(asio::make_strand(ctx)) {}

  // ---- start and stop -------------------------------------------------------

  asio::awaitable<std::string> listen() {
    // Before the socket exists: a SIGTERM from whoever saw it accept is a
    // clean stop (the socket file removed), never the default death.
    signals.emplace(strand, SIGINT, SIGTERM);
    signals->async_wait([this](const boost::system::error_code& e, int sig) {
      if (!e) {
        spdlog::info("kvstrand-server: signal {}, stopping", sig);
        shutdown();
      }
    });
    acceptor.emplace(strand);
    if (std::string why = bind_socket_path(*acceptor, opt.socket, socket_file, opt.socket_gid); !why.empty()) co_return why;
    // An acceptor ended by an exception would leave a server that accepts
    // no one: it stops instead (fail-stop), and wait()'s caller exits 1.
    auto acceptor_ended = [this](std::exception_ptr e) {
      if (!e) return;
      common::LogEscaped{"kvstrand-server acceptor"}(e);
      spdlog::critical("kvstrand-server: no longer accepting connections: stopping");
      failed = true;
      shutdown();
    };
    gate.spawn(accept_loop(), std::move(acceptor_ended));
    if (const auto every = watchdog_interval(); every.count() > 0) {
      watchdog.emplace(strand);
      // From the strand itself: a strand that stops turning goes untold, and
      // is restarted (a named arena keeps the cache).
      gate.spawn(feed_watchdog(*watchdog, every), common::LogEscaped{"kvstrand-server's watchdog"});
    }
    co_return std::string{};
  }

  // The arena, the levels below it, the request service, the tenants and
  // events, then the strand's thread, the socket, the filler and the debug
  // endpoint, in that order (TierServer::start).
  void start();

  void shutdown() {
    if (stopping) return;
    stopping = true;
    host.stop();
    if (acceptor) acceptor->close();
    accept_backoff.cancel();
    if (signals) signals->cancel();
    if (watchdog) watchdog->cancel();
    auto all = sessions;
    for (auto& [id, s] : all) end_session(s, "server stopping");
    for (auto& [pid, p] : processes) {
      boost::system::error_code ignored;
      p->watch.close(ignored);
    }
    processes.clear();
    // The server stops once every session's reader and writer and the
    // acceptor ended, and what was committed reached the levels below
    // (bounded).
    auto done = [this](std::exception_ptr e) {
      if (e) common::LogEscaped{"kvstrand-server's stop"}(e);
      stopped.set_value();
    };
    asio::co_spawn(strand, stop(), std::move(done));
  }

  asio::awaitable<void> stop() {
    if (!co_await gate.close(kStopBound))
      spdlog::warn("kvstrand-server: stopping with {} session coroutine(s) still running", gate.inside());
    // What was committed reaches the levels below first (bounded): a named
    // arena keeps its objects anyway, a memfd's are gone with the server
    // but for what reached the disk, and another node may be about to ask
    // L2 for them.
    for (LowerLevel* level : levels) {
      const std::size_t left = co_await level->drain(std::chrono::seconds(5));
      if (left != 0) spdlog::warn("kvstrand-server: stopping with {} object(s) not written to {}", left, level->name());
      co_await level->close(std::chrono::seconds(2));
    }
    if (publisher) co_await publisher->close(std::chrono::seconds(1));  // after the levels: their last events go out
  }

  // ---- sessions and processes -------------------------------------------------

  asio::awaitable<void> accept_loop() {
    for (;;) {
      // Named, not a structured binding (GCC 12, docs/development.md).
      std::tuple<boost::system::error_code, local::socket> accepted = co_await acceptor->async_accept(kAwait);
      auto& ec = std::get<0>(accepted);
      auto& sock = std::get<1>(accepted);
      if (ec) {
        if (ec == asio::error::operation_aborted || stopping) co_return;
        co_await accept_backoff.failed(ec.value(), "kvstrand-server");
        continue;
      }
      accept_backoff.succeeded();
      const auto cred = peer_credentials(sock.native_handle());
      const auto peer = cred ? identify(*cred, opt.binding, ::geteuid()) : common::Expected<Peer>(common::unexpected(cred.why()));
      if (!peer) {
        // Said once per user: a refused engine retries (every 2 s at most)
        // for as long as it runs, and each try would be a line.
        const uid_t who = cred ? cred->uid : static_cast<uid_t>(-1);
        if (refused_uids.size() < kRefusedUidsSaid && refused_uids.insert(who).second)
          spdlog::warn("kvstrand-server: refused a connection: {} (said once per user)", peer.why());
        else
          spdlog::debug("kvstrand-server: refused a connection: {}", peer.why());
        auto frame = encode_reply(Type::hello, 0, fail(Status::not_authorized, peer.why()));
        co_await asio::async_write(sock, asio::buffer(frame), kAwait);
        continue;
      }
      auto process = watch_process(cred->pid);
      if (!process) continue;  // gone already: nothing it asks for could be kept for it
      auto s = std::make_shared<Session>(next_session++);
      std::weak_ptr<Session> weak = s;
      s->conn = std::make_shared<channel::FramedConnection>(std::move(sock), strand, gate, [this, weak](const std::string& why) {
        if (auto ended = weak.lock()) end_session(ended, why);
      });
      s->process = process;
      s->client.session = s->id;
      s->client.owner = process->owner;
      s->client.peer = *peer;
      // Its tenant's segment, if it has one: the memory it is handed.
      s->client.pool = host.pools().pool_of(peer->tenant);
      ++process->sessions;
      sessions[s->id] = s;
      spdlog::debug("kvstrand-server: session {} from pid {} (uid {}{}{})", s->id, cred->pid, peer->uid,
                    peer->tenant.empty() ? "" : ", tenant ", peer->tenant);
      if (!gate.spawn(serve(s), ends_session(s, "a kvstrand-server session"))) end_session(s, "server stopping");
    }
  }

  std::shared_ptr<Process> watch_process(pid_t pid) {
    if (auto it = processes.find(pid); it != processes.end()) return it->second;
    const int fd = pidfd_open(pid);
    if (fd < 0) {
      spdlog::warn("kvstrand-server: pidfd_open({}): {}; connection refused", pid, std::strerror(errno));
      return nullptr;
    }
    auto p = std::make_shared<Process>(next_owner++, pid, fd, strand);
    processes[pid] = p;
    // A pidfd becomes readable once the process has exited: its threads are
    // gone and its files, device contexts among them, are closed, so no DMA
    // it started can still run.
    p->watch.async_wait(asio::posix::descriptor_base::wait_read,
                        [this, p](const boost::system::error_code& ec) { process_exited(p, ec); });
    return p;
  }

  void process_exited(const std::shared_ptr<Process>& p, const boost::system::error_code& ec) {
    if (ec || stopping) return;
    // Its connections end with it: a child it forked may hold one of them,
    // and anything created on it now would belong to no live process and
    // never be freed.
    std::vector<std::shared_ptr<Session>> its;
    for (auto& [id, s] : sessions)
      if (s->process == p) its.push_back(s);
    for (auto& s : its) end_session(s, "its process exited");
    const std::size_t freed = host.classes().release_owner(p->owner);
    orphans_freed += freed;
    spdlog::debug("kvstrand-server: pid {} exited; {} leases and reservations freed", p->pid, freed);
    if (auto it = processes.find(p->pid); it != processes.end() && it->second == p) processes.erase(it);
    boost::system::error_code ignored;
    p->watch.close(ignored);
  }

  asio::awaitable<void> serve(std::shared_ptr<Session> s) {
    std::string end = "client closed the connection";
    bool flush = false;  // the connection ends after its last reply, not now
    while (!s->ended) {
      // A client that does not read its replies is not read from either.
      co_await s->conn->drained_to(opt.max_reply_queue);
      if (s->ended) break;
      channel::ReadFrame f = co_await s->conn->read(opt.max_frame);
      if (f.io) break;
      const Header& h = f.h;
      const HeaderError he = f.header;
      if (he == HeaderError::bad_magic || he == HeaderError::too_large) {
        end = he == HeaderError::bad_magic ? "not a kvstrand frame" : "frame larger than --max-frame";
        break;
      }
      if (he == HeaderError::other_major) {
        // In the client's own version and for its own request type, so that
        // a client of any version can read why.
        send(s, encode_reply(static_cast<Type>(h.type & ~kReplyBit), h.request_id,
                             fail(Status::refused_version, "client speaks protocol " + std::to_string(h.major) +
                                                               "; this kvstrand-server speaks " +
                                                               std::to_string(kMajor) +
                                                               ": upgrade the client library to match the server"),
                             h.major));
        flush = true;
        break;
      }
      const std::vector<std::byte>& body = f.body;
      ++s->requests;
      auto req = decode_request(h.type, body);
      const Type type = static_cast<Type>(h.type & ~kReplyBit);
      if (!req) {
        count(type, Status::bad_request);
        send(s, encode_reply(type, h.request_id, fail(Status::bad_request, req.why())));
        continue;
      }
      if (const auto* lk = std::get_if<Lookup>(&*req)) co_await service->promote(s->client, *lk, s->ended);
      if (auto* rv = std::get_if<Reserve>(&*req); rv && host.growing())
        if (const tier::Index* idx = service->index_of(s->client, rv->registration))
          co_await host.room_for(*idx, rv->keys, s->ended);
      if (s->ended) break;  // ended while L2 answered, or while the arena grew
      Reply rep = service->handle(s->client, *req);
      count(type_of(*req), rep.status);
      const bool hello_ok = std::holds_alternative<Hello>(*req) && rep.status == Status::ok;
      send(s, encode_reply(type_of(*req), h.request_id, rep), hello_ok);
      if (std::holds_alternative<EndSession>(*req) && rep.status == Status::ok) {
        flush = true;
        break;
      }
    }
    if (flush) {
      s->conn->close_after_flush("closed after its last reply");
    } else {
      end_session(s, end);
    }
  }

  void count(Type t, Status st) { ++requests[common::labels({{"type", to_string(t)}, {"status", to_string(st)}})]; }

  // The hello's reply carries the fd of the client's pool: its tenant's
  // segment, the arena, or (read-only) the segment of the tenant it reads.
  void send(const std::shared_ptr<Session>& s, std::vector<std::byte> frame, bool with_pool_fd = false) {
    s->conn->send(std::move(frame), with_pool_fd ? host.pools().handed_fd(s->client.pool, s->client.reads) : -1);
  }

  // A session's reader or writer ended by an exception: the connection
  // ends (its client sees it closed and reconnects), the server goes on.
  std::function<void(std::exception_ptr)> ends_session(const std::shared_ptr<Session>& s, const char* what) {
    return [this, s, what](std::exception_ptr e) {
      if (!e) return;
      common::LogEscaped{what}(e);
      end_session(s, std::string(what) + " ended by an exception");
    };
  }

  // The connection ends; what its process holds stays with the process
  // (a copy may still run there) until released or the process exits.
  void end_session(const std::shared_ptr<Session>& s, const std::string& why) {
    if (s->ended) return;
    s->ended = true;
    s->conn->close();
    if (s->process) --s->process->sessions;
    sessions.erase(s->id);
    spdlog::debug("kvstrand-server: session {} ended: {}", s->id, why);
  }

  // ---- requests: the service's (server/request_service) ------------------------
  // ---- the debug endpoint: its routes (server/debug_routes), on the strand -------

  common::HttpRoutes routes() {
    return debug_routes(ServerState{stopping, sessions, processes, host.classes(), host.arena(), l2.get(), disk.get(),
                                    events.get(), &*tenants, host.mapped_slabs(), requests, *service, orphans_freed,
                                    accept_backoff, host.fill_error(), host.recovery(),
                                    [this] { return host.ready_bytes(); }, opt.socket, host.pools().segment_bytes(),
                                    opt.binding.maps_tenants() && opt.http && opt.http->token.empty()});
  }

  ServerOptions opt;
  asio::io_context ctx;
  asio::executor_work_guard<asio::io_context::executor_type> work;
  Strand strand;
  common::Gate gate{strand};  // the acceptor and every session's reader and writer run inside it
  // How long stopping waits for them (their sockets are closed by then).
  static constexpr std::chrono::seconds kStopBound{2};
  std::thread loop;
  ArenaHost host{strand, opt};  // the arena, its indexes and its growth
  std::unique_ptr<L2Tier> l2;
  std::unique_ptr<DiskTier> disk;
  std::optional<tier::TenantBook> tenants;     // the arena's (--tenant-quota)
  std::shared_ptr<EventPublisher> publisher;  // with --events
  std::unique_ptr<TierEvents> events;          // with --events
  std::vector<LowerLevel*> levels;  // below the arena, nearest first: the disk, then L2
  std::optional<local::acceptor> acceptor;
  std::optional<asio::signal_set> signals;
  std::optional<asio::steady_timer> watchdog;  // with $WATCHDOG_USEC: keep_watchdog_fed's tick
  std::map<std::uint64_t, std::shared_ptr<Session>> sessions;
  std::map<pid_t, std::shared_ptr<Process>> processes;
  std::uint64_t next_session = 1;
  tier::Owner next_owner = 1;
  SocketFile socket_file;  // the socket this server bound, removed at its exit
  std::optional<RequestService> service;  // with the arena
  std::uint64_t orphans_freed = 0;
  // Users whose refusal was logged (at most kRefusedUidsSaid: past them, debug only).
  static constexpr std::size_t kRefusedUidsSaid = 1024;
  std::set<uid_t> refused_uids;
  common::AcceptBackoff accept_backoff{strand};  // cancelled at shutdown
  bool stopping = false;
  bool failed = false;  // stopped because it could not go on (set before `stopped`)
  std::promise<void> stopped;
  common::LabeledCounter requests;
  std::unique_ptr<common::DebugHttp> http;
};

TierServer::TierServer(ServerOptions options) : impl_(std::make_shared<Impl>(std::move(options))) {}

TierServer::~TierServer() {
  stop();
  remove_socket_file(impl_->opt.socket, impl_->socket_file);
  if (impl_->http) impl_->http->stop();
  impl_->host.join_filler();
  impl_->work.reset();
  impl_->ctx.stop();
  if (impl_->loop.joinable()) impl_->loop.join();
  impl_->l2.reset();  // its Redis connections close; nothing runs on the strand now
  impl_->events.reset();  // before the indexes it watches
  impl_->disk.reset();
  impl_->publisher.reset();
}

namespace {
// A server life's id: random, never 0 (0 is "not said").
std::uint64_t server_life_id() {
  std::random_device rd;
  std::uint64_t id = 0;
  while (id == 0) id = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return id;
}
}  // namespace

void TierServer::Impl::start() {
  host.open();
  tier::SizeClasses& classes = host.classes();
  tier::Arena& arena = host.arena();
  if (opt.l2) l2 = std::make_unique<L2Tier>(strand, *opt.l2, host.map(), classes);
  if (opt.disk) {
    opt.disk->max_queued_bytes = arena.bytes() / 8;
    disk = std::make_unique<DiskTier>(strand, *opt.disk, host.map(), arena.slab_bytes(), host.pools().slab_count(),
                                      classes);
  }
  ServiceRules rules{opt.chunk_tokens, opt.max_client_leased, opt.max_client_reserved, opt.min_object_bytes,
                     opt.max_index_bytes};
  ServerFacts facts{arena.bytes(), arena.slab_bytes(), arena.huge_pages(),
                    [this] { return host.ready_bytes(); }, [this] { return sessions.size(); },
                    server_life_id(), host.pools().published()};
  // Nearest first: a lookup asks the disk before L2.
  if (disk) levels.push_back(disk.get());
  if (l2) levels.push_back(l2.get());
  service.emplace(rules, std::move(facts), classes, levels);
  tenants.emplace(opt.tenant_quotas, opt.tenant_default_quota.value_or(tier::TenantBook::kNoQuota), opt.max_tenants);
  classes.set_tenants(&*tenants);
  service->set_tenants(&*tenants);
  if (disk) disk->set_tenants(*tenants, arena.bytes());
  auto found =
      disk ? disk->take_recovered_descriptions() : std::unordered_map<kv::ChunkKey, std::string, tier::ChunkKeyHash>{};
  if (opt.events) {
    auto p = EventPublisher::open(strand, *opt.events);
    if (!p) throw std::runtime_error(p.why());
    publisher = *p;
    events = std::make_unique<TierEvents>(publisher);
    events->watch(classes, opt.events->arena_medium);
    if (disk) disk->set_events(events.get());
    if (l2) l2->set_events(events.get());
    service->set_events(events.get());
    // The first batch, before any client is served: what this start found.
    asio::post(strand, [this, found = std::move(found)] {
      events->announce_recovered(found);
      publisher->start();
    });
    spdlog::info("kvstrand-server: KV events on {} ({} format{}{})", opt.events->endpoint, to_string(opt.events->format),
                 opt.events->replay_endpoint.empty() ? "" : ", replay on ", opt.events->replay_endpoint);
  }
  loop = std::thread([this] { ctx.run(); });
  asio::post(strand, [levels = levels] {
    for (LowerLevel* level : levels) level->start();
  });
  std::string err = common::call_on(strand, [this] { return listen(); });
  if (!err.empty()) throw std::runtime_error(err);
  host.start_filling([this](std::uint32_t slab) {
    if (disk) disk->slab_ready(slab);
  });
  if (opt.http) {
    try {
      http = std::make_unique<common::DebugHttp>(strand, *opt.http, routes());
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(std::string("--http: ") + e.what());
    }
  }
}

void TierServer::start() { impl_->start(); }

std::uint16_t TierServer::http_port() const { return impl_->http ? impl_->http->port() : 0; }

bool TierServer::wait() {
  impl_->stopped.get_future().wait();
  return !impl_->failed;
}

void TierServer::stop() {
  if (!impl_->loop.joinable()) return;
  common::call_on(impl_->strand, [this]() -> asio::awaitable<void> {
    impl_->shutdown();
    co_return;
  });
}

}  // namespace kvstrand::server
