#include "connector/connector.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include <future>
#include <stdexcept>

#include <kvstrand/namespace_id.hpp>
#include "common/load_trace.hpp"
#include "device/keep_for_process_life.hpp"
#include "device/copy.hpp"
#include "device/load_path.hpp"
#include "proto/lease_handoff.hpp"
#include "connector/debug_routes.hpp"
#include "reactor/handoff_queue.hpp"
#include "index_plane/local_index.hpp"
#include "index_plane/remote_index.hpp"

namespace kvstrand::connector {

namespace asio = boost::asio;

namespace {

// Times one call on the engine thread into step_calls_ for /metrics; with
// the endpoint off there is no histogram and the step thread reads no clock.
struct CallTimer {
  explicit CallTimer(AtomicHistogram* h) : h_(h) {
    if (h_) t0_ = std::chrono::steady_clock::now();
  }
  ~CallTimer() {
    if (h_) h_->observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
  }
  AtomicHistogram* h_;
  std::chrono::steady_clock::time_point t0_;
};

// The debug endpoint the options ask for: `http` in full, else debug_port
// (negative: none) on debug_address.
std::optional<HttpOptions> http_of(const ConnectorOptions& o) {
  if (o.http) return o.http;
  if (o.debug_port < 0 || o.debug_port > 65535) return std::nullopt;
  HttpOptions h;
  h.address = o.debug_address;
  h.port = static_cast<std::uint16_t>(o.debug_port);
  return h;
}

}  // namespace

std::optional<kv::ConfigError> validate(const ConnectorOptions& o) {
  if (o.transfer_deadline.count() <= 0)
    return kv::ConfigError{"transfer_deadline", "must be > 0 ms, got " + std::to_string(o.transfer_deadline.count())};
  if (!o.make_index && o.server_socket.empty() && o.tier_bytes == 0)
    return kv::ConfigError{"tier_bytes", "must be > 0"};
  if (o.server_request_timeout.count() <= 0)
    return kv::ConfigError{"server_request_timeout", "must be > 0 ms"};
  if (o.server_uid < -1 || o.server_uid > static_cast<std::int64_t>(UINT32_MAX))
    return kv::ConfigError{"server_uid", "must be a uid, or -1 for none"};
  if (o.reactor.poller.max_backoff < o.reactor.poller.min_backoff || o.reactor.poller.min_backoff.count() <= 0)
    return kv::ConfigError{"poller.min_backoff", "must be > 0 and <= poller.max_backoff"};
  if (o.max_live_transfers == 0) return kv::ConfigError{"max_live_transfers", "must be > 0"};
  if (o.reactor_idle_spin.count() < 0)
    return kv::ConfigError{"reactor_idle_spin", "must be >= 0 us, got " + std::to_string(o.reactor_idle_spin.count())};
  if (o.max_live_lookups == 0) return kv::ConfigError{"max_live_lookups", "must be > 0"};
  if (!o.http && o.debug_port > 65535) return kv::ConfigError{"debug_port", "must be <= 65535"};
  if (!device::parse_load_path(o.load_path))
    return kv::ConfigError{"load_path", "must be rule, measure, kernel or dma-batch, got '" + o.load_path + "'"};
  if (auto h = http_of(o))
    if (auto e = validate(*h)) return e;
  return std::nullopt;
}


// ---- set-up -----------------------------------------------------------------

Connector::Connector(ConnectorOptions options)
    : options_(std::move(options)),
      admission_(options_.max_live_transfers),
      lookups_(options_.max_live_lookups, !options_.server_socket.empty()) {
  if (auto err = validate(options_)) throw std::invalid_argument(err->describe());
  if (device::Status s = device::use_load_path(*device::parse_load_path(options_.load_path), options_.device); !s.ok())
    throw std::invalid_argument(kv::ConfigError{"load_path", s.describe()}.describe());
  options_.reactor.device = options_.device;
  options_.reactor.poller.idle_spin = options_.reactor_idle_spin;
  options_.http = http_of(options_);
  reactor_ = std::make_unique<reactor::Reactor>(options_.reactor);
  mailbox_ = std::make_shared<Mailbox>();
  std::unique_ptr<index_plane::IndexPlane> index;
  if (options_.make_index) {
    index = options_.make_index(*reactor_);
  } else if (!options_.server_socket.empty()) {
    index = std::make_unique<index_plane::RemoteIndex>(
        *reactor_,
        index_plane::RemoteIndexOptions{
            options_.server_socket, options_.server_request_timeout, options_.device, options_.server_uid, {}});
  } else {
    index = std::make_unique<index_plane::LocalIndex>(options_.tier_bytes);
  }
  auto tier = std::make_unique<data_path::HostTier>(*reactor_, std::move(index));
  table_ = std::make_shared<TransferTable>(*reactor_, std::move(tier), mailbox_, options_.transfer_deadline);
  submissions_ = table_->submissions().get();
  reactor_->call([this]() -> asio::awaitable<void> {
    reactor_->poller().add_source(table_->submissions());
    co_return;
  });
  if (options_.http) {
    step_calls_ = std::make_shared<AtomicHistogram>();
    http_ = std::make_unique<DebugHttp>(reactor_->strand(), *options_.http, debug_routes(table_, step_calls_));
  }
}

Connector::~Connector() { close(); }

std::uint32_t Connector::register_layout(Registration registration) {
  if (closed_) throw TransferRefused(TransferErrc::closed, "register_layout after close()");
  if (auto err = registration.check()) throw TransferRefused(TransferErrc::bad_spec, *err);
  const auto id = static_cast<std::uint32_t>(admission_.registrations().size());
  index_plane::Failure refused =
      reactor_->call([table = table_, reg = registration]() mutable -> asio::awaitable<index_plane::Failure> {
        return table->attach(std::move(reg));
      });
  // The tier's words, once; TransferRefused appends the code's own text.
  if (refused) throw TransferRefused(refused.ec, "register_layout: registration " + std::to_string(id) + ": " + refused.why);
  // The sizes its loads' segments will have, timed on this host's two load
  // paths now, on this (the engine's registering) thread: not on the strand.
  if (!registration.lookup_only()) {
    std::vector<std::uint64_t> sizes;
    for (const kv::Plane& p : registration.layout.planes) sizes.push_back(p.bytes_per_block);
    if (registration.layout.has_state()) {
      if (registration.state_parts.empty()) sizes.push_back(registration.layout.checkpoint.image_bytes);
      for (const StateMemory& m : registration.state_parts) sizes.push_back(m.slot_bytes);
    }
    if (device::Status s = device::measure_load_paths_for(std::move(sizes), options_.device); !s.ok())
      spdlog::warn("kvstrand: load_path=measure: the probe failed ({}); loads follow the built-in rule: {}",
                   s.describe(), device::fastest_batch_path());
  }
  admission_.add(std::move(registration));
  return id;
}

std::uint64_t Connector::invalidate(std::uint32_t registration) {
  if (closed_) throw TransferRefused(TransferErrc::closed, "invalidate after close()");
  if (registration >= admission_.registrations().size())
    throw TransferRefused(TransferErrc::not_registered, "invalidate: no registration " + std::to_string(registration));
  index_plane::IndexPlane::Dropped d =
      reactor_->call([table = table_, registration]() -> asio::awaitable<index_plane::IndexPlane::Dropped> {
        co_return co_await table->tier().index().drop(registration);
      });
  if (d.failure) throw TransferRefused(d.failure.ec, "invalidate: " + d.failure.why);
  return d.objects;
}

void Connector::raise_fail_stop() const {
  if (!mailbox_->failed()) return;  // the common case reads one atomic
  if (auto f = mailbox_->fail_stop()) throw FailStop(f->code, f->what);
}

void Connector::check_open() const {
  raise_fail_stop();
  if (closed_) throw TransferRefused(TransferErrc::closed, "the connector is closed");
}

template <class F>
void Connector::post_after_submissions(F f) {
  asio::post(reactor_->strand(), [table = table_, f = std::move(f)]() mutable {
    table->submissions()->poll();
    f();
  });
}

// ---- transfers --------------------------------------------------------------

// One transfer is a batch of one, on the stack: no vector to allocate.
void Connector::save(kv::TransferSpec spec, std::shared_ptr<const device::Event> producer) {
  Op op{TransferKind::save, std::move(spec), std::move(producer)};
  submit_ops({&op, 1});
}

void Connector::load(kv::TransferSpec spec, std::shared_ptr<const device::Event> producer) {
  common::LoadTrace::mark(common::LoadTrace::called);
  Op op{TransferKind::load, std::move(spec), std::move(producer)};
  submit_ops({&op, 1});
  common::LoadTrace::mark(common::LoadTrace::returned);
}

void Connector::submit(std::vector<Op> ops) { submit_ops(ops); }

void Connector::submit_ops(std::span<Op> ops) {
  CallTimer timed(step_calls_.get());
  // The ring slots this batch will write were last read by the strand:
  // their lines come over while the checks below run. (The fields and the
  // packed words of a transfer of a chunk or two.)
  submissions_->prefetch(ops.size(), 320);
  if (ops.empty()) return;
  check_open();
  admission_.admit(ops, *mailbox_);
  // The common case: each into the ring, which an awake strand takes on its
  // next tick (no lock, no wake-up), and one wake-up check for the batch,
  // however the loop ends. A full ring: the rest in a post, after the ring.
  struct Notify {
    reactor::HandoffQueue<Submission>& ring;
    ~Notify() { ring.notify(); }
  } notify{*submissions_};
  std::vector<Submission> rest;
  for (Op& op : ops) {
    // A load naming a lease ends it: no other load, export or release may.
    if (op.kind == TransferKind::load && op.spec.tier_lease != 0) lookups_.drop(op.spec.tier_lease);
    LiveTransfer& live = admission_.add_live(op);
    auto fill = [&](Submission& s) {
      s.kind = op.kind;
      s.spec = &live.spec;
      s.queued_notice = live.load ? &live.queued.event : nullptr;
      s.producer = std::move(op.producer);
      pack(live.spec, s.packed);
    };
    if (!rest.empty() || !submissions_->stage(fill)) fill(rest.emplace_back());
  }
  if (!rest.empty())
    post_after_submissions([table = table_, rest = std::move(rest)]() mutable {
      for (Submission& s : rest) table->start(s);
    });
}

LoadOrder Connector::order_after_load(const std::string& request, device::Stream& stream, std::uint32_t registration) {
  CallTimer timed(step_calls_.get());
  raise_fail_stop();
  const LiveTransfer* live = admission_.find(TransferKeyView{request, TransferKind::load, registration});
  if (live == nullptr) return LoadOrder::no_live_load;
  // Alive while the entry is: the transfer, then its undrained end, holds it.
  const device::Event* ev = live->queued.event.load(std::memory_order_acquire);
  if (ev == nullptr) return LoadOrder::not_queued_yet;
  if (device::Status s = stream.wait(*ev); !s.ok())
    throw TransferRefused(TransferErrc::device_error, "order_after_load of request '" + request + "': " + s.describe());
  return LoadOrder::ordered;
}

bool Connector::finished_pending() const noexcept { return mailbox_->pending(); }

Finished Connector::finished() {
  // The step loop's common case, nothing new: no lock, no clock read.
  if (!mailbox_->pending()) return Finished{};
  CallTimer timed(step_calls_.get());
  raise_fail_stop();
  mailbox_->drain_locked(drained_);
  Finished f;
  std::size_t saves = 0, safe = 0;
  auto tally = [&](const TransferEnd& e) {
    saves += e.kind == TransferKind::save;
    safe += e.source_safe;
  };
  const std::size_t in_ring = mailbox_->peek_ends(tally);
  for (const TransferEnd& e : drained_.ends) tally(e);
  f.saves.reserve(saves);  // each vector allocated once
  f.loads.reserve(in_ring + drained_.ends.size() - saves);
  f.source_safe.reserve(safe);
  mailbox_->drain_ends(in_ring, [&](TransferEnd& e) { admission_.end(e, f); });
  for (TransferEnd& e : drained_.ends) admission_.end(e, f);
  drained_.ends.clear();
  f.lookups = std::move(drained_.lookups);
  drained_.lookups.clear();
  lookups_.answered(f, admission_.registrations());
  if (!f.loads.empty()) common::LoadTrace::mark(common::LoadTrace::drained);
  return f;
}

// ---- lookups and leases -----------------------------------------------------

std::uint64_t Connector::lookup(std::vector<kv::ChunkKey> keys, std::uint32_t registration) {
  CallTimer timed(step_calls_.get());
  check_open();
  admission_.check_registered(registration);
  const std::uint64_t id = lookups_.start();
  // The node tier's leases can be exported: what was asked is kept until
  // the answer says what the lease holds.
  lookups_.asked(id, registration, keys);
  post_after_submissions([table = table_, id, registration, keys = std::move(keys)]() mutable {
    table->start_lookup(id, registration, std::move(keys));
  });
  return id;
}

std::vector<std::byte> Connector::export_lease(std::uint64_t lease) {
  check_open();
  if (options_.server_socket.empty())
    throw TransferRefused(TransferErrc::bad_spec, "export_lease: only the node tier (server_socket) leases what a "
                                                  "lookup found; the embedded tier's hits cannot leave this process");
  std::vector<std::byte> bytes = proto::encode_lease_handoff(proto::LeaseHandoff{lease, lookups_.take(lease)});
  post_after_submissions([table = table_, lease] { table->tier().index().forget_lease(lease); });
  return bytes;
}

std::uint64_t Connector::adopt_lease(std::span<const std::byte> handoff) {
  CallTimer timed(step_calls_.get());
  auto h = proto::decode_lease_handoff(handoff);
  if (!h) throw TransferRefused(TransferErrc::bad_spec, "adopt_lease: " + h.why());
  if (options_.server_socket.empty())
    throw TransferRefused(TransferErrc::bad_spec, "adopt_lease: only the node tier (server_socket) can adopt a lease");
  // The registration whose layout makes these keys.
  const auto& regs = admission_.registrations();
  std::optional<std::uint32_t> reg;
  for (std::uint32_t i = 0; i < regs.size() && !reg; ++i) {
    const kv::Layout& l = regs[i].layout;
    if (kv::namespace_of(l) == h->keys.front().ns && kv::kv_rank_of(l) == h->keys.front().kv_rank) reg = i;
  }
  if (!reg) throw TransferRefused(TransferErrc::bad_spec, "adopt_lease: no registration here has the layout (model, "
                                                          "geometry, rank) whose keys the lease holds");
  check_open();
  const std::uint64_t id = lookups_.start();
  lookups_.asked(id, *reg, h->keys);
  post_after_submissions([table = table_, id, r = *reg, lease = h->lease, keys = std::move(h->keys)]() mutable {
    table->start_adopt(id, r, lease, std::move(keys));
  });
  return id;
}

void Connector::release_lookup(std::uint64_t lease) {
  CallTimer timed(step_calls_.get());
  if (closed_ || lease == 0) return;
  lookups_.drop(lease);
  post_after_submissions([table = table_, lease] { table->start_release(lease); });
}

// ---- fences and close -------------------------------------------------------

std::exception_ptr Connector::fence_exception(const Mailbox& mailbox, std::error_code ec) {
  if (auto f = mailbox.fail_stop()) return std::make_exception_ptr(FailStop(f->code, f->what));
  if (ec == TransferErrc::closed) return std::make_exception_ptr(TransferRefused(ec, "fence: the connector is closed"));
  if (ec) return std::make_exception_ptr(FailStop(ec, "kvstrand: fence: " + ec.message()));
  return nullptr;
}

void Connector::start_fence(std::vector<std::string> requests, std::chrono::milliseconds timeout, Handler handler) {
  if (closed_) {
    TransferTable::complete(std::move(handler), TransferErrc::closed);
    return;
  }
  // After the ring: a fence covers every transfer submitted before it.
  post_after_submissions([table = table_, r = std::move(requests), timeout, h = std::move(handler)]() mutable {
    table->fence(std::move(r), timeout, false, std::move(h));
  });
}

void Connector::fence(const std::vector<std::string>& requests, std::chrono::milliseconds timeout) {
  CallTimer timed(step_calls_.get());
  raise_fail_stop();
  // The strand hands back an error_code and the exception is made here, on
  // the caller's thread: an exception_ptr made on the reactor thread and
  // released last by either thread is shared through libstdc++'s own
  // reference count, which ThreadSanitizer cannot see (it reported a race).
  std::promise<std::error_code> done;
  std::future<std::error_code> result = done.get_future();
  start_fence(requests, timeout, Handler([p = std::move(done)](std::error_code ec) mutable { p.set_value(ec); }));
  if (std::exception_ptr e = fence_exception(*mailbox_, result.get())) std::rethrow_exception(e);
}

void Connector::start_close(Handler handler) {
  if (closed_) {
    TransferTable::complete(std::move(handler), {});
    return;
  }
  closed_ = true;
  auto done = [h = std::move(handler)](std::exception_ptr) mutable { TransferTable::complete(std::move(h), {}); };
  asio::co_spawn(reactor_->strand(), TransferTable::settle(table_), std::move(done));
}

void Connector::close() {
  if (stopped_) return;
  if (!closed_) {
    closed_ = true;
    // Shutdown itself fails nothing: transfers settle or reach their
    // deadlines, and close_bound() caps the wait whatever they do.
    reactor_->call([table = table_] { return TransferTable::settle(table); });
  }
  stopped_ = true;
  if (http_) http_->stop();  // before the reactor stops: its connections close on the strand
  reactor_->stop();
  // After the reactor thread ended: nothing can touch the tier now, except
  // a copy never seen to end. Then the tier (its streams, its arena or
  // mappings) is left allocated on purpose: freeing it could hand memory
  // that copy still writes to someone else, and waiting could be forever.
  table_->release_tier();
}

// Read only once the reactor thread has ended: nothing changes stuck then.
std::size_t Connector::never_ended() const noexcept { return stopped_ ? table_->stuck_count() : 0; }

// ---- debug views (each a hop to the strand and back) -------------------------

std::vector<TransferInfo> Connector::transfers() {
  if (stopped_) return {};
  return reactor_->call([table = table_]() -> asio::awaitable<std::vector<TransferInfo>> {
    table->submissions()->poll();
    co_return table->snapshot();
  });
}

std::size_t Connector::kept_transfers() {
  if (stopped_) return 0;
  return reactor_->call([table = table_]() -> asio::awaitable<std::size_t> { co_return table->spare_transfers(); });
}

tier::Index::Stats Connector::tier_stats() {
  if (stopped_) return {};
  return reactor_->call([table = table_]() -> asio::awaitable<tier::Index::Stats> { co_return table->tier().index().stats(); });
}

void* Connector::load_stream_native() {
  device::Stream* s = tier_streams().load;
  return s ? s->native() : nullptr;
}

Connector::TierStreams Connector::tier_streams() {
  if (stopped_) return {};
  return reactor_->call([table = table_]() -> asio::awaitable<TierStreams> {
    co_return TierStreams{table->tier().save_stream(), table->tier().load_stream()};
  });
}

Connector::ArenaMappings Connector::arena_mappings() {
  if (stopped_) return {};
  return reactor_->call([table = table_]() -> asio::awaitable<ArenaMappings> { co_return table->tier().index().server_link(); });
}

reactor::PollerStats Connector::poller_stats() {
  if (stopped_) return {};
  return reactor_->call(
      [r = reactor_.get()]() -> asio::awaitable<reactor::PollerStats> { co_return r->poller().stats(); });
}

device::EventPool::Stats Connector::event_stats() {
  if (stopped_) return {};
  return reactor_->call([r = reactor_.get()]() -> asio::awaitable<device::EventPool::Stats> { co_return r->events().stats(); });
}

}  // namespace kvstrand::connector
