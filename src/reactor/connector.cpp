#include "common/gate.hpp"
#include "common/log_escaped.hpp"
#include "reactor/connector.hpp"

#include <boost/asio/append.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <algorithm>
#include <deque>
#include <future>
#include <list>
#include <map>
#include <stdexcept>

#include "reactor/connector_metrics.hpp"
#include "reactor/handoff_queue.hpp"
#include "reactor/packed_spec.hpp"
#include "common/debug_page.hpp"
#include "reactor/local_tier.hpp"
#include "reactor/node_tier.hpp"
#include "hip/keep_for_process_life.hpp"
#include "reactor/queued_events.hpp"
#include "proto/lease_handoff.hpp"
#include <kvstrand/namespace_id.hpp>

namespace kvstrand::reactor {

using common::LogEscaped;

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

const char* to_string(TransferState s) noexcept {
  switch (s) {
    case TransferState::queued: return "queued";
    case TransferState::waiting_producer: return "waiting for producer event";
    case TransferState::submitted: return "submitted";
    case TransferState::pending: return "pending";
    case TransferState::done: return "done";
    case TransferState::failed: return "failed";
  }
  return "?";
}

namespace {

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
  if (!o.make_tier && o.server_socket.empty() && o.tier_bytes == 0)
    return kv::ConfigError{"tier_bytes", "must be > 0"};
  if (o.server_request_timeout.count() <= 0)
    return kv::ConfigError{"server_request_timeout", "must be > 0 ms"};
  if (o.reactor.poller.max_backoff < o.reactor.poller.min_backoff || o.reactor.poller.min_backoff.count() <= 0)
    return kv::ConfigError{"poller.min_backoff", "must be > 0 and <= poller.max_backoff"};
  if (o.max_live_transfers == 0) return kv::ConfigError{"max_live_transfers", "must be > 0"};
  if (o.reactor_idle_spin.count() < 0)
    return kv::ConfigError{"reactor_idle_spin", "must be >= 0 us, got " + std::to_string(o.reactor_idle_spin.count())};
  if (o.max_live_lookups == 0) return kv::ConfigError{"max_live_lookups", "must be > 0"};
  if (!o.http && o.debug_port > 65535) return kv::ConfigError{"debug_port", "must be <= 65535"};
  if (auto h = http_of(o))
    if (auto e = validate(*h)) return e;
  return std::nullopt;
}

// ---- the strand side ---------------------------------------------------------

// Everything here runs on the reactor strand, and only there.
struct Connector::Core : std::enable_shared_from_this<Connector::Core> {
  struct Live {
    std::shared_ptr<Transfer> t;
    std::unique_ptr<asio::steady_timer> deadline;
  };
  // Boost 1.81's any_completion_handler must not be move-assigned (it
  // recurses), so fences live in a list and are only moved-constructed.
  struct Fence {
    Fence(std::uint64_t i, std::set<std::string> r, bool a, Handler h)
        : id(i), requests(std::move(r)), all(a), handler(std::move(h)) {}
    Fence(Fence&&) noexcept = default;
    Fence& operator=(Fence&&) = delete;

    std::uint64_t id = 0;
    std::set<std::string> requests;
    bool all = false;  // close(): every transfer
    Handler handler;
    std::unique_ptr<asio::steady_timer> timer;
  };

  Core(Reactor& r, std::unique_ptr<Tier> t, std::shared_ptr<Mailbox> m, std::chrono::milliseconds d)
      : reactor(r), tier(std::move(t)), mailbox(std::move(m)), deadline(d), gate(r.strand()),
        // Core outlives every tick that polls the queue: the poller drops it
        // when the reactor stops, before the Connector lets Core go.
        submissions(std::make_shared<HandoffQueue<Submission>>(kSubmissionSlots, r.poller(),
                                                              [this](Submission& p) { start(p); })),
        queued_events(*mailbox) {}

  // Transfers of submit() not yet taken by the strand; more wait in posts.
  static constexpr std::size_t kSubmissionSlots = 256;

  // The submission stays in the ring's slot for the engine's thread to
  // write over; only the producer's reference is taken out, so that the
  // engine's event is released once seen complete, not when the slot comes
  // round again.
  void start(Submission& p) {
    auto t = std::make_shared<Transfer>();
    t->id = next_id++;
    t->kind = p.kind;
    t->spec = unpack(p.packed.words());  // all the strand reads of the spec, once
    t->engine_spec = p.spec;
    t->producer = std::move(p.producer);
    if (t->kind == TransferKind::load && p.queued_notice != nullptr && (t->queued_event = queued_events.lend()))
      t->queued_notice = p.queued_notice;
    t->posted = Clock::now();
    t->deadline = t->posted + deadline;
    Live& live = transfers[t->id];
    live.t = t;
    live.deadline = std::make_unique<asio::steady_timer>(reactor.strand(), t->deadline);
    live.deadline->async_wait([self = shared_from_this(), id = t->id](const boost::system::error_code& ec) {
      if (!ec) self->deadline_passed(id);
    });
    ++live_per_request[t->spec.request];
    // An exception escaping the transfer's coroutine fails that transfer
    // with its cause; nothing is left waiting for a deadline.
    auto escaped = [self = shared_from_this(), t](std::exception_ptr e) {
      if (!e) return;
      LogEscaped{"a transfer"}(e);
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        t->reason = std::string("exception: ") + x.what();
      } catch (...) {
        t->reason = "unknown exception";
      }
      self->finish(*t, TransferErrc::device_error);
    };
    // The engine thread refuses posts after close(), and close's own work is
    // posted after every earlier post: a closing gate here is a bug caught
    // as a refusal, not a transfer left running past close.
    if (!gate.spawn(run(shared_from_this(), t), std::move(escaped))) {
      t->reason = "the connector is closed";
      finish(*t, TransferErrc::closed);
    }
  }

  // One transfer: producer event -> submit -> completion -> terminal.
  static asio::awaitable<void> run(std::shared_ptr<Core> self, std::shared_ptr<Transfer> t) {
    if (t->producer != nullptr) {
      t->state = TransferState::waiting_producer;
      const auto t0 = Clock::now();
      std::error_code ec = co_await self->reactor.poller().ready(*t->producer);
      t->producer.reset();  // seen complete (or failed): the engine's event is not touched again
      self->metrics.producer_wait_seconds.observe(std::chrono::duration<double>(Clock::now() - t0).count());
      if (ec) {
        t->reason = "producer event: " + ec.message();
        self->finish(*t, TransferErrc::device_error);
        co_return;
      }
    }
    if (t->terminal()) {  // its deadline passed while it waited: do not touch memory now
      self->stuck.erase(t->id);
      co_return;
    }
    t->state = TransferState::submitted;
    // The tier says when the copies are queued; only this strand writes the transfer.
    auto queued = [t](hip::Stream& stream) {
      if (t->terminal()) return;  // failed by its deadline meanwhile
      t->state = TransferState::pending;
      // A load's copies are queued: the engine may now order its own stream
      // after them (Connector::order_after_load).
      if (t->queued_notice != nullptr && t->queued_event->record(stream).ok())
        t->queued_notice->store(t->queued_event, std::memory_order_release);
    };
    TierJob job{t->spec, t->deadline, std::move(queued), [t] { return !t->terminal(); }};
    // (One co_await a statement: GCC 12 destroys a conditional's awaited
    // temporaries twice.)
    TierOutcome o;
    if (t->kind == TransferKind::save) {
      o = co_await self->tier->save(std::move(job));
    } else {
      o = co_await self->tier->load(std::move(job));
    }
    if (o.error && !t->terminal()) t->reason = std::move(o.reason);
    self->finish(*t, o.error);
  }

  void finish(Transfer& t, std::error_code ec) {
    if (t.terminal()) {  // already failed by its deadline
      // Its copy has now ended, unless shutdown cut the wait short.
      if (ec != std::errc::operation_canceled) stuck.erase(t.id);
      return;
    }
    t.state = ec ? TransferState::failed : TransferState::done;
    t.error = ec;
    transfers.erase(t.id);  // the entry owns the deadline timer: erasing it cancels it
    deliver(t);
  }

  void deadline_passed(std::uint64_t id) {
    auto it = transfers.find(id);
    if (it == transfers.end()) return;
    std::shared_ptr<Transfer> t = it->second.t;
    const std::string what = std::string("kvstrand: ") + to_string(t->kind) + " of request '" + t->spec.request +
                             "' (transfer " + std::to_string(id) + ") passed its " +
                             std::to_string(deadline.count()) + " ms deadline while " + to_string(t->state);
    t->state = TransferState::failed;
    t->error = TransferErrc::deadline_exceeded;
    t->reason = what;
    set_fail_stop(TransferErrc::deadline_exceeded, what);
    stuck[id] = t;
    transfers.erase(it);
    deliver(*t);
  }

  void set_fail_stop(std::error_code code, const std::string& what) {
    if (!fail_code) {
      fail_code = code;
      fail_what = what;
      ++metrics.fail_stops;
    }
    mailbox->set_fail_stop(code, what);
  }

  // Bytes a transfer moves: its blocks, and the images it carries.
  std::uint64_t bytes_of(const Transfer& t) const {
    if (t.spec.registration >= regs.size()) return 0;
    const kv::Layout& l = regs[t.spec.registration].layout;
    return t.spec.blocks.size() * l.bytes_per_block() +
           std::uint64_t{images_of(regs[t.spec.registration], t.spec)} * l.checkpoint.image_bytes;
  }

  // Hands the transfer's end to the engine's thread, which frees or reuses
  // its entry from then on (the strand reads only its own spec).
  void deliver(Transfer& t) {
    metrics.transfer_ended(t.kind, t.error, bytes_of(t), std::chrono::duration<double>(Clock::now() - t.posted).count());
    auto r = live_per_request.find(t.spec.request);
    if (r != live_per_request.end() && --r->second == 0) live_per_request.erase(r);
    // A save frees its source blocks once its copy out of them is known to
    // have ended (done, failed, or never queued). Never after a deadline
    // failure or a shutdown that cut the wait short: the copy may still run.
    const bool source_safe = t.kind == TransferKind::save && t.error != TransferErrc::deadline_exceeded &&
                             t.error != std::errc::operation_canceled;
    const EndReceipt receipt = mailbox->push_end([&](TransferEnd& e) {
      e.kind = t.kind;
      e.ok = t.state == TransferState::done;
      e.error = t.error;
      e.source_safe = source_safe;
      e.reason.assign(t.reason);
      e.spec = t.engine_spec;
    });
    // No record after the end (the transfer is terminal); the engine may
    // wait on the event until it has taken the end.
    if (t.queued_event != nullptr) queued_events.give_back(std::exchange(t.queued_event, nullptr), receipt);
    check_fences();
  }

  bool fence_done(const Fence& f) const {
    if (f.all) return transfers.empty();
    for (const std::string& r : f.requests)
      if (live_per_request.contains(r)) return false;
    return true;
  }

  void fence(std::vector<std::string> requests, std::chrono::milliseconds timeout, bool all, Handler h) {
    Fence f(next_fence++, std::set<std::string>(requests.begin(), requests.end()), all, std::move(h));
    if (fence_done(f)) {
      complete(std::move(f.handler), fail_code.value_or(std::error_code{}));
      return;
    }
    f.timer = std::make_unique<asio::steady_timer>(reactor.strand(), timeout);
    f.timer->async_wait([self = shared_from_this(), id = f.id, timeout, all](const boost::system::error_code& ec) {
      if (ec) return;
      if (all) self->close_timed_out(id, timeout);
      else self->fence_timed_out(id, timeout);
    });
    fences.push_back(std::move(f));
  }

  void check_fences() {
    for (auto it = fences.begin(); it != fences.end();) {
      if (!fence_done(*it)) {
        ++it;
        continue;
      }
      Handler h = std::move(it->handler);
      it = fences.erase(it);
      complete(std::move(h), fail_code.value_or(std::error_code{}));
    }
  }

  void fence_timed_out(std::uint64_t id, std::chrono::milliseconds timeout) {
    for (auto it = fences.begin(); it != fences.end(); ++it) {
      if (it->id != id) continue;
      std::string what = "kvstrand: fence timed out after " + std::to_string(timeout.count()) +
                         " ms with transfers still live:";
      for (const auto& [tid, live] : transfers)
        if (it->requests.contains(live.t->spec.request))
          what += " " + std::to_string(tid) + " (" + to_string(live.t->kind) + " of '" + live.t->spec.request +
                  "', " + to_string(live.t->state) + ")";
      set_fail_stop(TransferErrc::fence_timeout, what);
      Handler h = std::move(it->handler);
      fences.erase(it);
      complete(std::move(h), TransferErrc::fence_timeout);
      return;
    }
  }

  // close() has waited its bound and transfers are still live: only a
  // deadline that never fired leaves one so long. Each is failed and kept
  // as stuck (the memory it names is never freed or reused by kvstrand),
  // the fail-stop is set, and the log names every one.
  void close_timed_out(std::uint64_t id, std::chrono::milliseconds bound) {
    if (std::none_of(fences.begin(), fences.end(), [id](const Fence& f) { return f.id == id; })) return;
    std::string names;
    std::vector<std::shared_ptr<Transfer>> abandoned;
    for (auto& [tid, live] : transfers) abandoned.push_back(live.t);
    for (const auto& t : abandoned) {
      names += " " + std::to_string(t->id) + " (" + to_string(t->kind) + " of '" + t->spec.request + "', " +
               to_string(t->state) + ")";
      t->state = TransferState::failed;
      t->error = TransferErrc::deadline_exceeded;
      t->reason = "kvstrand: close() abandoned it after " + std::to_string(bound.count()) +
                  " ms: its copy was never seen to end";
      stuck[t->id] = t;
      transfers.erase(t->id);
    }
    const std::string what = "kvstrand: close() gave up after " + std::to_string(bound.count()) +
                             " ms on transfers still live (kept as stuck, their memory left alone):" + names;
    spdlog::error("{}", what);
    set_fail_stop(TransferErrc::deadline_exceeded, what);
    for (const auto& t : abandoned) deliver(*t);
    check_fences();
  }

  static void complete(Handler h, std::error_code ec) { asio::dispatch(asio::append(std::move(h), ec)); }

  std::vector<TransferInfo> snapshot() const {
    std::vector<TransferInfo> out;
    const auto now = Clock::now();
    auto add = [&](const Transfer& t, bool past) {
      TransferInfo i;
      i.id = t.id;
      i.request = t.spec.request;
      i.kind = t.kind;
      i.state = t.state;
      i.age = std::chrono::duration_cast<std::chrono::microseconds>(now - t.posted);
      i.deadline_left = std::chrono::duration_cast<std::chrono::microseconds>(t.deadline - now);
      i.bytes = bytes_of(t);
      i.past_deadline = past;
      out.push_back(i);
    };
    for (const auto& [id, live] : transfers) add(*live.t, false);
    for (const auto& [id, t] : stuck) add(*t, true);
    return out;
  }

  Reactor& reactor;
  std::unique_ptr<Tier> tier;
  std::shared_ptr<Mailbox> mailbox;
  std::chrono::milliseconds deadline;
  // Every coroutine the Connector starts (transfers, lookups, adoptions,
  // lease releases) runs inside it; close() closes it. Each one's
  // completion holds the Core, so the gate outlives what it counts.
  common::Gate gate;
  // The engine thread's submit()s, taken on every poller tick. Everything
  // else the engine thread posts polls it first (post_after_submissions):
  // the strand sees the engine's calls in the order they were made.
  std::shared_ptr<HandoffQueue<Submission>> submissions;
  std::deque<Registration> regs;  // by id; a deque: tiers keep pointers to them
  // A load's "copies queued" event; none if the device cannot make one:
  // order_after_load then answers not_queued_yet and the engine waits for
  // finished().
  QueuedEvents queued_events;
  std::uint64_t next_id = 1;
  std::uint64_t next_fence = 1;
  std::map<std::uint64_t, Live> transfers;                     // live
  std::map<std::uint64_t, std::shared_ptr<Transfer>> stuck;    // failed by deadline, copy not seen to end
  std::map<std::string, std::uint32_t> live_per_request;
  std::list<Fence> fences;
  std::optional<std::error_code> fail_code;
  std::string fail_what;
  ConnectorMetrics metrics;
};

// ---- the engine side ---------------------------------------------------------

Connector::Connector(ConnectorOptions options) : options_(std::move(options)) {
  if (auto err = validate(options_)) throw std::invalid_argument(err->describe());
  options_.reactor.device = options_.device;
  options_.reactor.poller.idle_spin = options_.reactor_idle_spin;
  options_.http = http_of(options_);
  reactor_ = std::make_unique<Reactor>(options_.reactor);
  mailbox_ = std::make_shared<Mailbox>();
  std::unique_ptr<Tier> tier;
  if (options_.make_tier) {
    tier = options_.make_tier(*reactor_);
  } else if (!options_.server_socket.empty()) {
    tier = std::make_unique<NodeTier>(
        *reactor_, NodeTierOptions{options_.server_socket, options_.server_request_timeout, options_.device});
  } else {
    tier = std::make_unique<LocalTier>(*reactor_, options_.tier_bytes);
  }
  core_ = std::make_shared<Core>(*reactor_, std::move(tier), mailbox_, options_.transfer_deadline);
  submissions_ = core_->submissions.get();
  reactor_->call([this]() -> asio::awaitable<void> {
    reactor_->poller().add_source(core_->submissions);
    co_return;
  });
  if (options_.http) start_http();
}

// The debug endpoint's routes run on the strand, so they read Core directly.
void Connector::start_http() {
  step_calls_ = std::make_shared<AtomicHistogram>();
  HttpRoutes routes;
  Reactor* r = reactor_.get();
  routes["/healthz"] = [core = core_] {
    if (!core->fail_code) return HttpResponse{200, "text/plain", "ok\n"};
    return HttpResponse{503, "text/plain", "fail-stop: " + core->fail_what + "\n"};
  };
  routes["/debug/transfers"] = [core = core_] {
    return HttpResponse{200, "application/json", transfers_json(core->snapshot(), core->tier->kind())};
  };
  routes["/debug/events"] = [r] {
    return HttpResponse{200, "application/json", events_json(r->events().stats(), r->poller().stats())};
  };
  routes["/debug/tier"] = [core = core_] {
    return HttpResponse{200, "application/json", tier_json(core->tier->kind(), core->tier->stats(), core->metrics)};
  };
  routes["/metrics"] = [core = core_, r, steps = step_calls_] {
    return HttpResponse{200, "text/plain; version=0.0.4",
                        prometheus(core->metrics, steps->snapshot(), core->tier->stats(), r->events().stats(),
                                   core->transfers.size() + core->stuck.size())};
  };
  common::add_debug_page(routes, "kvstrand connector", {"/debug/transfers", "/debug/events", "/debug/tier"});
  http_ = std::make_unique<DebugHttp>(reactor_->strand(), *options_.http, std::move(routes));
}

Connector::~Connector() { close(); }

std::uint32_t Connector::register_layout(Registration registration) {
  if (closed_) throw TransferRefused(TransferErrc::closed, "register_layout after close()");
  if (auto err = registration.check()) throw TransferRefused(TransferErrc::bad_spec, *err);
  const auto id = static_cast<std::uint32_t>(registrations_.size());
  Failure refused = reactor_->call([core = core_, reg = registration]() mutable -> asio::awaitable<Failure> {
    core->regs.push_back(std::move(reg));
    Failure r = co_await core->tier->attach(core->regs.back());
    if (r) core->regs.pop_back();  // a tier keeps only what it attached
    co_return r;
  });
  // The tier's words, once; TransferRefused appends the code's own text.
  if (refused) throw TransferRefused(refused.ec, "register_layout: registration " + std::to_string(id) + ": " + refused.why);
  InUse in_use;
  std::uint32_t blocks = 0;
  for (const auto& p : registration.planes) blocks = std::max(blocks, p.num_blocks);
  in_use.reading.assign(blocks, 0);
  in_use.writing.assign(blocks, 0);
  in_use.reading_slots.assign(state_slot_count(registration), 0);
  in_use.writing_slots.assign(state_slot_count(registration), 0);
  in_use_.push_back(std::move(in_use));
  registrations_.push_back(std::move(registration));
  return id;
}

void Connector::raise_fail_stop() const {
  if (!mailbox_->failed()) return;  // the common case reads one atomic
  if (auto f = mailbox_->fail_stop()) throw FailStop(f->code, f->what);
}

void Connector::check_open_and_registered(std::uint32_t registration) const {
  raise_fail_stop();
  if (closed_) throw TransferRefused(TransferErrc::closed, "the connector is closed");
  if (registrations_.empty()) throw TransferRefused(TransferErrc::not_registered, "no layout registered");
  if (registration >= registrations_.size())
    throw TransferRefused(TransferErrc::bad_spec, "registration " + std::to_string(registration) +
                                                      " does not exist (" + std::to_string(registrations_.size()) +
                                                      " registered, ids from 0)");
}

const Registration& Connector::registration_of(const kv::TransferSpec& spec) const {
  return registrations_.at(spec.registration);
}

void Connector::check(TransferKind kind, const kv::TransferSpec& spec) const {
  check_open_and_registered(spec.registration);
  if (live_.contains(TransferKeyView{spec.request, kind, spec.registration}))
    throw TransferRefused(TransferErrc::duplicate_transfer, std::string("a ") + to_string(kind) + " of request '" +
                                                                spec.request + "' (registration " +
                                                                std::to_string(spec.registration) + ") is still live");
  const Registration& reg = registration_of(spec);
  auto err = kind == TransferKind::save ? reg.check_save(spec) : reg.check_load(spec);
  if (err) throw TransferRefused(TransferErrc::bad_spec, std::string(to_string(kind)) + " of request '" +
                                                             spec.request + "': " + *err);
}

void Connector::save(kv::TransferSpec spec, std::shared_ptr<const hip::Event> producer) {
  std::vector<Op> ops;
  ops.push_back({TransferKind::save, std::move(spec), std::move(producer)});
  submit(std::move(ops));
}

void Connector::load(kv::TransferSpec spec, std::shared_ptr<const hip::Event> producer) {
  std::vector<Op> ops;
  ops.push_back({TransferKind::load, std::move(spec), std::move(producer)});
  submit(std::move(ops));
}

void Connector::submit(std::vector<Op> ops) {
  CallTimer timed(step_calls_.get());
  // The ring slots this batch will write were last read by the strand:
  // their lines come over while the checks below run. (The fields and the
  // packed words of a transfer of a chunk or two.)
  submissions_->prefetch(ops.size(), 320);
  batch_.clear();
  for (const Op& op : ops) {
    check(op.kind, op.spec);
    batch_.emplace_back(op.spec.request, op.kind, op.spec.registration);
  }
  std::sort(batch_.begin(), batch_.end());
  if (auto d = std::adjacent_find(batch_.begin(), batch_.end()); d != batch_.end())
    throw TransferRefused(TransferErrc::duplicate_transfer, std::string("two ") + to_string(d->kind) +
                                                                "s of request '" + std::string(d->request) +
                                                                "' in one batch");
  if (live_.size() + batch_.size() > options_.max_live_transfers)
    throw TransferRefused(TransferErrc::too_many_live,
                          std::to_string(live_.size()) + " transfers live and " + std::to_string(batch_.size()) +
                              " more would pass max_live_transfers (" + std::to_string(options_.max_live_transfers) +
                              "): drain finished() first");
  // Blocks and image slots: checked against the live transfers and the
  // batch's own earlier ops, and counted. A transfer whose outcome waits in
  // the mailbox (terminal, e.g. covered by a fence that returned) uses
  // nothing: on a conflict those are forgotten and the batch tried once more.
  if (const auto refusal = claim(ops)) {
    forget_uses(mailbox_->terminal());
    if (claim(ops)) throw TransferRefused(TransferErrc::blocks_in_use, *refusal);
  }
  // The common case: each into the ring, which an awake strand takes on its
  // next tick (no lock, no wake-up), and one wake-up check for the batch,
  // however the loop ends. A full ring: the rest in a post, after the ring.
  struct Notify {
    HandoffQueue<Submission>& ring;
    ~Notify() { ring.notify(); }
  } notify{*submissions_};
  std::vector<Submission> rest;
  for (Op& op : ops) {
    // A load naming a lease ends it: no other load, export or release may.
    if (op.kind == TransferKind::load && op.spec.tier_lease != 0) leases_held_.erase(op.spec.tier_lease);
    Uses& live = add_live(op);
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
    post_after_submissions([core = core_, rest = std::move(rest)]() mutable {
      for (Submission& s : rest) core->start(s);
    });
}

Connector::Uses& Connector::add_live(Op& op) {
  // A drained node's string and slot list keep their capacity; the spec
  // itself is the engine's, moved in.
  auto it = spare_.insert(live_, [&](TransferKey& k, Uses& u) {
    k.request.assign(op.spec.request);
    k.kind = op.kind;
    k.registration = op.spec.registration;
    u.load = op.kind == TransferKind::load;
    u.counting = true;
    u.slots.clear();
    any_slot_use(registrations_[op.spec.registration], op.spec, [&](std::int32_t slot) {
      u.slots.push_back(slot);
      return false;
    });
    u.spec = std::move(op.spec);
    u.queued.event.store(nullptr, std::memory_order_relaxed);  // published with the submission
  });
  return it->second;
}

template <class F>
void Connector::post_after_submissions(F f) {
  asio::post(reactor_->strand(), [core = core_, f = std::move(f)]() mutable {
    core->submissions->poll();
    f();
  });
}

std::uint64_t Connector::start_lookup(std::uint32_t registration) {
  check_open_and_registered(registration);
  if (lookups_live_ >= options_.max_live_lookups)
    throw TransferRefused(TransferErrc::too_many_live, std::to_string(lookups_live_) +
                                                           " lookups unanswered or undrained: max_live_lookups (" +
                                                           std::to_string(options_.max_live_lookups) +
                                                           ") reached; drain finished() first");
  ++lookups_live_;
  return next_lookup_++;
}

std::uint64_t Connector::lookup(std::vector<kv::ChunkKey> keys, std::uint32_t registration) {
  CallTimer timed(step_calls_.get());
  const std::uint64_t id = start_lookup(registration);
  // The node tier's leases can be exported: what was asked is kept until
  // the answer says what the lease holds.
  if (!options_.server_socket.empty()) asked_[id] = Asked{registration, keys};
  // A lookup whose coroutine threw is answered with a miss: every lookup
  // id gets its answer (the engine may be deferring a request on it).
  auto escaped = [core = core_, id, registration](std::exception_ptr e) {
    if (!e) return;
    LogEscaped{"a lookup"}(e);
    core->mailbox->push(LookupOutcome{id, {}, 0, registration});
  };
  auto start = [core = core_, id, registration, keys = std::move(keys), escaped = std::move(escaped)]() mutable {
    if (!core->gate.spawn(answer_lookup(core, id, registration, std::move(keys)), std::move(escaped)))
      core->mailbox->push(LookupOutcome{id, {}, 0, registration});  // closing: a miss, still an answer
  };
  post_after_submissions(std::move(start));
  return id;
}

asio::awaitable<void> Connector::answer_lookup(std::shared_ptr<Core> core, std::uint64_t id,
                                               std::uint32_t registration, std::vector<kv::ChunkKey> keys) {
  const std::size_t asked = keys.size();
  Tier::LookupResult r = co_await core->tier->lookup(registration, std::move(keys));
  const std::uint32_t ct = core->regs.at(registration).layout.chunk_tokens;
  if (ct > 0) core->metrics.lookup_answered(asked, r.hit.tokens / ct);
  const bool hit = r.hit.tokens > 0;
  core->mailbox->push(LookupOutcome{id, std::move(r.hit), r.lease, registration});
  // A hit's load is the engine's next call: be polling when it comes.
  if (hit) core->reactor.poller().kick();
}

std::vector<std::byte> Connector::export_lease(std::uint64_t lease) {
  raise_fail_stop();
  if (closed_) throw TransferRefused(TransferErrc::closed, "the connector is closed");
  if (options_.server_socket.empty())
    throw TransferRefused(TransferErrc::bad_spec, "export_lease: only the node tier (server_socket) leases what a "
                                                  "lookup found; the embedded tier's hits cannot leave this process");
  auto it = leases_held_.find(lease);
  if (lease == 0 || it == leases_held_.end())
    throw TransferRefused(TransferErrc::bad_spec, "export_lease: lease " + std::to_string(lease) +
                                                      " is not held here (never drained from finished(), already "
                                                      "named by a load, released or exported)");
  std::vector<std::byte> bytes = proto::encode_lease_handoff(proto::LeaseHandoff{lease, std::move(it->second.keys)});
  leases_held_.erase(it);
  post_after_submissions([core = core_, lease] { core->tier->forget_lease(lease); });
  return bytes;
}

std::uint64_t Connector::adopt_lease(std::span<const std::byte> handoff) {
  CallTimer timed(step_calls_.get());
  auto h = proto::decode_lease_handoff(handoff);
  if (!h) throw TransferRefused(TransferErrc::bad_spec, "adopt_lease: " + h.why());
  if (options_.server_socket.empty())
    throw TransferRefused(TransferErrc::bad_spec, "adopt_lease: only the node tier (server_socket) can adopt a lease");
  // The registration whose layout makes these keys.
  std::optional<std::uint32_t> reg;
  for (std::uint32_t i = 0; i < registrations_.size() && !reg; ++i) {
    const kv::Layout& l = registrations_[i].layout;
    if (kv::namespace_of(l) == h->keys.front().ns && kv::kv_rank_of(l) == h->keys.front().kv_rank) reg = i;
  }
  if (!reg) throw TransferRefused(TransferErrc::bad_spec, "adopt_lease: no registration here has the layout (model, "
                                                          "geometry, rank) whose keys the lease holds");
  const std::uint64_t id = start_lookup(*reg);
  asked_[id] = Asked{*reg, h->keys};
  auto escaped = [core = core_, id, r = *reg](std::exception_ptr e) {
    if (!e) return;
    LogEscaped{"a lease adoption"}(e);
    core->mailbox->push(LookupOutcome{id, {}, 0, r});
  };
  auto start = [core = core_, id, r = *reg, lease = h->lease, keys = std::move(h->keys),
                escaped = std::move(escaped)]() mutable {
    if (!core->gate.spawn(answer_adopt(core, id, r, lease, std::move(keys)), std::move(escaped)))
      core->mailbox->push(LookupOutcome{id, {}, 0, r});
  };
  post_after_submissions(std::move(start));
  return id;
}

asio::awaitable<void> Connector::answer_adopt(std::shared_ptr<Core> core, std::uint64_t id,
                                              std::uint32_t registration, std::uint64_t lease,
                                              std::vector<kv::ChunkKey> keys) {
  Tier::LookupResult r = co_await core->tier->adopt(registration, lease, std::move(keys));
  const bool hit = r.hit.tokens > 0;
  core->mailbox->push(LookupOutcome{id, std::move(r.hit), r.lease, registration});
  if (hit) core->reactor.poller().kick();
}

LoadOrder Connector::order_after_load(const std::string& request, hip::Stream& stream, std::uint32_t registration) {
  CallTimer timed(step_calls_.get());
  raise_fail_stop();
  auto it = live_.find(TransferKeyView{request, TransferKind::load, registration});
  if (it == live_.end()) return LoadOrder::no_live_load;
  // Alive while the entry is: the transfer, then its undrained end, holds it.
  const hip::Event* ev = it->second.queued.event.load(std::memory_order_acquire);
  if (ev == nullptr) return LoadOrder::not_queued_yet;
  if (hip::Status s = stream.wait(*ev); !s.ok())
    throw TransferRefused(TransferErrc::device_error, "order_after_load of request '" + request + "': " + s.describe());
  return LoadOrder::ordered;
}

void Connector::release_lookup(std::uint64_t lease) {
  CallTimer timed(step_calls_.get());
  if (closed_ || lease == 0) return;
  leases_held_.erase(lease);
  auto start = [core = core_, lease] {
    (void)core->gate.spawn(release_on_strand(core, lease), [core](std::exception_ptr e) {
      LogEscaped{"a lease release"}(e);
    });
  };
  post_after_submissions(std::move(start));
}

asio::awaitable<void> Connector::release_on_strand(std::shared_ptr<Core> core, std::uint64_t lease) {
  co_await core->tier->release_lookup(lease);
}

// Why `op` cannot use its blocks and slots now: one a live transfer (or an
// earlier op of its batch, counted already) writes, or, for a load, reads.
std::optional<std::string> Connector::conflict(const Op& op) const {
  const InUse& u = in_use_[op.spec.registration];
  const bool load = op.kind == TransferKind::load;
  auto why = [&](const std::string& what, bool written) {
    return std::string(to_string(op.kind)) + " of request '" + op.spec.request + "': " + what + " of registration " +
           std::to_string(op.spec.registration) + " is " + (written ? "being loaded into" : "being saved from") +
           " by a live transfer";
  };
  for (kv::BlockId b : op.spec.blocks) {
    const bool written = u.writing[b] > 0;
    if (written || (load && u.reading[b] > 0)) return why("block " + std::to_string(b), written);
  }
  std::optional<std::string> refusal;
  any_slot_use(registrations_[op.spec.registration], op.spec, [&](std::int32_t s) {
    const bool written = u.writing_slots[s] > 0;
    if (written || (load && u.reading_slots[s] > 0)) refusal = why("image slot " + std::to_string(s), written);
    return refusal.has_value();
  });
  return refusal;
}

void Connector::count(const Uses& u, int delta) {
  if (!u.counting) return;
  InUse& in = in_use_[u.spec.registration];
  for (kv::BlockId b : u.spec.blocks) (u.load ? in.writing : in.reading)[b] += delta;
  for (std::int32_t s : u.slots) (u.load ? in.writing_slots : in.reading_slots)[s] += delta;
}

void Connector::count(const Op& op, int delta) {
  InUse& in = in_use_[op.spec.registration];
  const bool load = op.kind == TransferKind::load;
  for (kv::BlockId b : op.spec.blocks) (load ? in.writing : in.reading)[b] += delta;
  any_slot_use(registrations_[op.spec.registration], op.spec, [&](std::int32_t s) {
    (load ? in.writing_slots : in.reading_slots)[s] += delta;
    return false;
  });
}

std::optional<std::string> Connector::claim(const std::vector<Op>& ops) {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (auto refusal = conflict(ops[i])) {
      for (std::size_t j = 0; j < i; ++j) count(ops[j], -1);
      return refusal;
    }
    count(ops[i], +1);
  }
  return std::nullopt;
}

void Connector::forget_uses(const std::vector<TransferKey>& terminal) {
  for (const auto& key : terminal) {
    auto it = live_.find(key);
    if (it == live_.end()) continue;
    count(it->second, -1);
    // Terminal: still live for duplicate_transfer until drained, using nothing.
    it->second.counting = false;
  }
}


void Connector::forget_lookups(const Finished& f) {
  lookups_live_ -= std::min(lookups_live_, f.lookups.size());
  // A lease an answer brought: what it holds, for export_lease.
  for (const auto& l : f.lookups) {
    auto it = asked_.find(l.id);
    if (it == asked_.end()) continue;
    const std::uint32_t ct = registrations_.at(it->second.registration).layout.chunk_tokens;
    const std::size_t n = ct == 0 ? 0 : l.hit.tokens / ct;
    if (l.lease != 0 && n > 0 && n <= it->second.keys.size()) {
      it->second.keys.resize(n);
      leases_held_[l.lease] = std::move(it->second);
    }
    asked_.erase(it);
  }
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
  // Each outcome is made here from the transfer's live entry, whose spec
  // the end names: this thread's memory, freed (or reused) by this thread.
  auto end = [&](TransferEnd& e) {
    // Always there: an entry is dropped only here, once its end is drained.
    auto it = live_.find(TransferKeyView{e.spec->request, e.kind, e.spec->registration});
    Uses& u = it->second;
    TransferOutcome o;
    o.request = it->first.request;
    o.kind = e.kind;
    o.registration = u.spec.registration;
    o.ok = e.ok;
    o.error = e.error;
    o.reason = e.reason;  // a copy: a ring slot's buffer stays the strand's
    o.tokens = u.spec.tokens;
    if (e.source_safe) f.source_safe.push_back(SourceSafe{o.request, o.registration, u.spec.blocks});
    // A save's outcome names its blocks; a failed load's, the blocks it
    // would have written.
    count(u, -1);  // a terminal one (forget_uses) counts nothing any more
    if (e.kind == TransferKind::save || !e.ok) o.blocks = std::move(u.spec.blocks);
    (e.kind == TransferKind::save ? f.saves : f.loads).push_back(std::move(o));
    spare_.erase(live_, it);
  };
  mailbox_->drain_ends(in_ring, end);
  for (TransferEnd& e : drained_.ends) end(e);
  drained_.ends.clear();
  f.lookups = std::move(drained_.lookups);
  drained_.lookups.clear();
  forget_lookups(f);
  return f;
}

std::exception_ptr Connector::fence_exception(const Mailbox& mailbox, std::error_code ec) {
  if (auto f = mailbox.fail_stop()) return std::make_exception_ptr(FailStop(f->code, f->what));
  if (ec == TransferErrc::closed) return std::make_exception_ptr(TransferRefused(ec, "fence: the connector is closed"));
  if (ec) return std::make_exception_ptr(FailStop(ec, "kvstrand: fence: " + ec.message()));
  return nullptr;
}

void Connector::start_fence(std::vector<std::string> requests, std::chrono::milliseconds timeout, Handler handler) {
  if (closed_) {
    Core::complete(std::move(handler), TransferErrc::closed);
    return;
  }
  // After the ring: a fence covers every transfer submitted before it.
  post_after_submissions([core = core_, r = std::move(requests), timeout, h = std::move(handler)]() mutable {
    core->fence(std::move(r), timeout, false, std::move(h));
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

namespace {
// On the strand: resumes once every live transfer is terminal (settled, or
// failed by its own deadline), lets the tier drain (a lookup waiting on the
// server ends with it), then closes the gate: what else runs inside it
// ends, within the same bound.
template <class Core, class Handler>
asio::awaitable<void> settle_all(std::shared_ptr<Core> core) {
  core->submissions->poll();  // every transfer submitted before close() is one it waits for
  const auto bound = close_bound(core->deadline) - std::chrono::milliseconds(500);
  const auto until = std::chrono::steady_clock::now() + bound;
  // Built before the co_await: GCC 12 miscompiles a capturing lambda
  // written inside the co_await expression.
  auto wait_all = [core, bound](auto handler) { core->fence({}, bound, true, Handler(std::move(handler))); };
  asio::use_awaitable_t<> token;
  std::error_code ec = co_await asio::async_initiate<decltype(token), void(std::error_code)>(wait_all, token);
  (void)ec;  // a fail-stop, if any, is already in the mailbox
  // A transfer whose copy was never seen to end stays inside the gate for
  // good (it is kept as stuck): waiting for it would only spend the bound.
  co_await core->tier->drain();
  const auto left = core->stuck.empty() ? until - std::chrono::steady_clock::now() : std::chrono::steady_clock::duration{};
  const bool emptied = co_await core->gate.close(left);
  if (!emptied && core->stuck.empty())
    spdlog::warn("kvstrand: close: {} lookup(s) or release(s) still running at close's bound", core->gate.inside());
}
}  // namespace

void Connector::start_close(Handler handler) {
  if (closed_) {
    Core::complete(std::move(handler), {});
    return;
  }
  closed_ = true;
  auto done = [h = std::move(handler)](std::exception_ptr) mutable { Core::complete(std::move(h), {}); };
  asio::co_spawn(reactor_->strand(), settle_all<Core, Handler>(core_), std::move(done));
}

void Connector::close() {
  if (stopped_) return;
  if (!closed_) {
    closed_ = true;
    // Shutdown itself fails nothing: transfers settle or reach their
    // deadlines, and close_bound() caps the wait whatever they do.
    reactor_->call([core = core_] { return settle_all<Core, Handler>(core); });
  }
  stopped_ = true;
  if (http_) http_->stop();  // before the reactor stops: its connections close on the strand
  reactor_->stop();
  // After the reactor thread ended: nothing can touch the tier now, except
  // a copy never seen to end. Then the tier (its streams, its arena or
  // mappings) is left allocated on purpose: freeing it could hand memory
  // that copy still writes to someone else, and waiting could be forever.
  if (!core_->stuck.empty()) {
    spdlog::warn("kvstrand: close: {} transfer(s) never seen to end; the tier's memory is left allocated on purpose",
                 core_->stuck.size());
    hip::keep_for_process_life(std::move(core_->tier));
    return;
  }
  core_->tier.reset();
}

// Read only once the reactor thread has ended: nothing changes stuck then.
std::size_t Connector::never_ended() const noexcept { return stopped_ ? core_->stuck.size() : 0; }

std::vector<TransferInfo> Connector::transfers() {
  if (stopped_) return {};
  return reactor_->call([core = core_]() -> asio::awaitable<std::vector<TransferInfo>> {
    core->submissions->poll();
    co_return core->snapshot();
  });
}

tier::Index::Stats Connector::tier_stats() {
  if (stopped_) return {};
  return reactor_->call([core = core_]() -> asio::awaitable<tier::Index::Stats> { co_return core->tier->stats(); });
}

void* Connector::load_stream_native() {
  if (stopped_) return nullptr;
  return reactor_->call([core = core_]() -> asio::awaitable<void*> {
    auto* host = dynamic_cast<HostTier*>(core->tier.get());
    hip::Stream* s = host ? host->load_stream() : nullptr;
    co_return s ? s->native() : nullptr;
  });
}

Connector::ArenaMappings Connector::arena_mappings() {
  if (stopped_) return {};
  return reactor_->call([core = core_]() -> asio::awaitable<ArenaMappings> {
    auto* node = dynamic_cast<NodeTier*>(core->tier.get());
    co_return node ? ArenaMappings{node->arena_mapped(), node->arena_kept(), node->reconnects(),
                                   node->turned_away(), node->connect_attempts(), node->refusals()}
                   : ArenaMappings{};
  });
}

PollerStats Connector::poller_stats() {
  if (stopped_) return {};
  return reactor_->call([r = reactor_.get()]() -> asio::awaitable<PollerStats> { co_return r->poller().stats(); });
}

hip::EventPool::Stats Connector::event_stats() {
  if (stopped_) return {};
  return reactor_->call([r = reactor_.get()]() -> asio::awaitable<hip::EventPool::Stats> { co_return r->events().stats(); });
}

}  // namespace kvstrand::reactor
