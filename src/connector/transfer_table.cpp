#include "connector/transfer_table.hpp"

#include <boost/asio/append.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/load_trace.hpp"
#include "common/log_escaped.hpp"
#include "device/keep_for_process_life.hpp"
#include "reactor/handoff_queue.hpp"
#include "index_plane/transfer_error.hpp"

namespace kvstrand::connector {

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

TransferTable::TransferTable(reactor::Reactor& r, std::unique_ptr<data_path::HostTier> t, std::shared_ptr<Mailbox> m,
                             std::chrono::milliseconds d)
    : reactor_(r),
      tier_(std::move(t)),
      mailbox_(std::move(m)),
      deadline_(d),
      gate_(r.strand()),
      // The table outlives every tick that polls the queue: the poller drops
      // it when the reactor stops, before the Connector lets the table go.
      submissions_(std::make_shared<reactor::HandoffQueue<Submission>>(kSubmissionSlots, r.poller(),
                                                                       [this](Submission& p) { start(p); })),
      queued_events_(*mailbox_),
      deadline_timer_(r.strand()) {}

// The submission stays in the ring's slot for the engine's thread to
// write over; only the producer's reference is taken out, so that the
// engine's event is released once seen complete, not when the slot comes
// round again.
void TransferTable::start(Submission& p) {
  if (p.kind == TransferKind::load) common::LoadTrace::mark(common::LoadTrace::taken);
  std::shared_ptr<Transfer> t = fresh_transfer();
  t->id = next_id_++;
  t->kind = p.kind;
  unpack_into(p.packed.words(), t->spec);  // all the strand reads of the spec, once
  t->engine_spec = p.spec;
  t->producer = std::move(p.producer);
  if (t->kind == TransferKind::load && p.queued_notice != nullptr && (t->queued_event = queued_events_.lend()))
    t->queued_notice = p.queued_notice;
  t->posted = Clock::now();
  t->deadline = t->posted + deadline_;
  transfers_.push_back(t);
  deadlines_.emplace_back(t->deadline, t->id);
  if (!deadline_armed_) arm_deadlines();
  add_request(t->spec.request);
  // An exception escaping the transfer's coroutine fails that transfer
  // with its cause; nothing is left waiting for a deadline. Either way the
  // coroutine has ended: the Transfer may be kept for reuse.
  auto ended = [self = shared_from_this(), t](std::exception_ptr e) {
    if (e) {
      LogEscaped{"a transfer"}(e);
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        t->reason = std::string("exception: ") + x.what();
      } catch (...) {
        t->reason = "unknown exception";
      }
      self->finish(*t, TransferErrc::device_error);
    }
    self->keep_ended(t);
  };
  // The engine thread refuses posts after close(), and close's own work is
  // posted after every earlier post: a closing gate here is a bug caught
  // as a refusal, not a transfer left running past close.
  if (!gate_.spawn(run(shared_from_this(), t), std::move(ended))) {
    t->reason = "the connector is closed";
    finish(*t, TransferErrc::closed);
  }
}

std::shared_ptr<Transfer> TransferTable::fresh_transfer() {
  if (spare_transfers_.empty()) return std::make_shared<Transfer>();
  std::shared_ptr<Transfer> t = std::move(spare_transfers_.back());
  spare_transfers_.pop_back();
  // Everything start() does not write; the spec is unpacked over.
  t->queued_event = nullptr;
  t->queued_notice = nullptr;
  t->state = TransferState::queued;
  t->error = {};
  t->reason.clear();
  return t;
}

void TransferTable::keep_ended(const std::shared_ptr<Transfer>& t) {
  // Anyone else's reference (stuck_, a coroutine frame not yet gone) means
  // the Transfer may still be read: it is not reused then, only freed.
  if (t.use_count() == 1 && t->terminal() && spare_transfers_.size() < kSpareTransfers) {
    t->producer.reset();  // nothing of the engine's is kept past the end (a coroutine that threw before its wait)
    spare_transfers_.push_back(t);
  }
}

std::deque<std::shared_ptr<Transfer>>::iterator TransferTable::live(std::uint64_t id) {
  auto it = std::lower_bound(transfers_.begin(), transfers_.end(), id,
                             [](const std::shared_ptr<Transfer>& t, std::uint64_t i) { return t->id < i; });
  return it != transfers_.end() && (*it)->id == id ? it : transfers_.end();
}

void TransferTable::add_request(const std::string& request) {
  if (auto r = live_per_request_.find(request); r != live_per_request_.end()) {
    ++r->second;
    return;
  }
  spare_requests_.insert(live_per_request_, [&](std::string& key, std::uint32_t& n) {
    key.assign(request);
    n = 1;
  });
}

void TransferTable::drop_request(const std::string& request) {
  auto r = live_per_request_.find(request);
  if (r != live_per_request_.end() && --r->second == 0) spare_requests_.erase(live_per_request_, r);
}

// One transfer: producer event -> submit -> completion -> terminal.
asio::awaitable<void> TransferTable::run(std::shared_ptr<TransferTable> self, std::shared_ptr<Transfer> t) {
  const bool load = t->kind == TransferKind::load;
  if (load) common::LoadTrace::mark(common::LoadTrace::running);
  if (t->producer != nullptr) {
    t->state = TransferState::waiting_producer;
    const auto t0 = Clock::now();
    std::error_code ec = co_await self->reactor_.poller().ready(*t->producer);
    t->producer.reset();  // seen complete (or failed): the engine's event is not touched again
    self->metrics_.producer_wait_seconds.observe(std::chrono::duration<double>(Clock::now() - t0).count());
    if (ec) {
      t->reason = "producer event: " + ec.message();
      self->finish(*t, TransferErrc::device_error);
      co_return;
    }
  }
  if (t->terminal()) {  // its deadline passed while it waited: do not touch memory now
    self->stuck_.erase(t->id);
    co_return;
  }
  t->state = TransferState::submitted;
  // Prepare, post, then check: the tier never writes the transfer, and a
  // copy is queued only while the transfer still wants it (its deadline
  // may pass while the tier waits for its index: then no byte is copied
  // into, or out of, blocks the engine was told about).
  // At once where the index answers at once (the embedded tier's loads):
  // no coroutine of the tier's to start, run and return from.
  std::optional<data_path::HostTier::Copy> prepared = self->tier_->prepare_now(t->kind, t->spec, t->deadline);
  if (!prepared) {
    data_path::HostTier::Copy awaited = co_await self->tier_->prepare(t->kind, t->spec, t->deadline);
    prepared.emplace(std::move(awaited));
  }
  data_path::HostTier::Copy& copy = *prepared;
  if (load) common::LoadTrace::mark(common::LoadTrace::held);
  if (!t->terminal()) {
    // A load's copies-queued event is the one recorded after its copies:
    // the poller awaits it, and the engine may order its own stream after
    // it (Connector::order_after_load) once it is published here.
    device::Event* queued = t->queued_notice != nullptr ? t->queued_event : nullptr;
    if (self->tier_->post(copy, queued) != nullptr) {
      t->state = TransferState::pending;
      if (copy.recorded(queued)) t->queued_notice->store(t->queued_event, std::memory_order_release);
      if (load) common::LoadTrace::mark(common::LoadTrace::published);
    }
  }
  data_path::TierOutcome o = co_await self->tier_->complete(std::move(copy));
  // The index gave up at the transfer's deadline (a server that did not
  // answer by then): the transfer fails as its deadline's own timer fails
  // it, fail-stop included, whichever of the two the strand ran first.
  if (o.error == TransferErrc::deadline_exceeded && !t->terminal()) self->deadline_passed(t->id);
  if (o.error && !t->terminal()) t->reason = std::move(o.reason);
  self->finish(*t, o.error);
}

void TransferTable::finish(Transfer& t, std::error_code ec) {
  if (t.terminal()) {  // already failed by its deadline
    // Its copy has now ended, unless shutdown cut the wait short.
    if (ec != std::errc::operation_canceled) stuck_.erase(t.id);
    return;
  }
  t.state = ec ? TransferState::failed : TransferState::done;
  t.error = ec;
  if (auto it = live(t.id); it != transfers_.end()) transfers_.erase(it);
  forget_ended_deadlines();
  deliver(t);
}

void TransferTable::forget_ended_deadlines() {
  while (!deadlines_.empty() && !is_live(deadlines_.front().second)) deadlines_.pop_front();
}

// The timer is not cancelled when the transfers it watches end: it fires
// once at the oldest one's deadline and is armed again for the next live
// one's, if any. Its handler holds the table weakly: an armed timer never
// keeps the table past the Connector's close.
void TransferTable::arm_deadlines() {
  forget_ended_deadlines();
  if (deadlines_.empty()) return;
  deadline_armed_ = true;
  deadline_timer_.expires_at(deadlines_.front().first);
  deadline_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
    if (auto self = weak.lock()) {
      self->deadline_armed_ = false;
      if (!ec) self->deadlines_due();
    }
  });
}

void TransferTable::deadlines_due() {
  const auto now = Clock::now();
  while (!deadlines_.empty() && deadlines_.front().first <= now) {
    const std::uint64_t id = deadlines_.front().second;
    deadlines_.pop_front();
    deadline_passed(id);  // nothing where that transfer has ended
  }
  if (!deadline_armed_) arm_deadlines();
}

void TransferTable::deadline_passed(std::uint64_t id) {
  auto it = live(id);
  if (it == transfers_.end()) return;
  std::shared_ptr<Transfer> t = *it;
  const std::string what = std::string("kvstrand: ") + to_string(t->kind) + " of request '" + t->spec.request +
                           "' (transfer " + std::to_string(id) + ") passed its " +
                           std::to_string(deadline_.count()) + " ms deadline while " + to_string(t->state);
  t->state = TransferState::failed;
  t->error = TransferErrc::deadline_exceeded;
  t->reason = what;
  set_fail_stop(TransferErrc::deadline_exceeded, what);
  stuck_[id] = t;
  transfers_.erase(it);
  forget_ended_deadlines();
  deliver(*t);
}

void TransferTable::set_fail_stop(std::error_code code, const std::string& what) {
  if (!fail_code_) {
    fail_code_ = code;
    fail_what_ = what;
    ++metrics_.fail_stops;
  }
  mailbox_->set_fail_stop(code, what);
}

// Bytes a transfer moves: its blocks, and the images it carries.
std::uint64_t TransferTable::bytes_of(const Transfer& t) const {
  const Registration* reg = tier_ ? tier_->index().registrations().find(t.spec.registration) : nullptr;
  if (reg == nullptr) return 0;
  const kv::Layout& l = reg->layout;
  return t.spec.blocks.size() * l.bytes_per_block() +
         std::uint64_t{data_path::images_of(*reg, t.spec)} * l.checkpoint.image_bytes;
}

// Hands the transfer's end to the engine's thread, which frees or reuses
// its entry from then on (the strand reads only its own spec).
void TransferTable::deliver(Transfer& t) {
  metrics_.transfer_ended(t.kind, t.error, bytes_of(t), std::chrono::duration<double>(Clock::now() - t.posted).count());
  drop_request(t.spec.request);
  // A save frees its source blocks once its copy out of them is known to
  // have ended (done, failed, or never queued). Never after a deadline
  // failure or a shutdown that cut the wait short: the copy may still run.
  const bool may_still_copy = t.error == TransferErrc::deadline_exceeded || t.error == std::errc::operation_canceled;
  const bool source_safe = t.kind == TransferKind::save && !may_still_copy;
  // Before the push: once pushed, the engine's thread may take it.
  if (t.kind == TransferKind::load) common::LoadTrace::mark(common::LoadTrace::delivered);
  const EndReceipt receipt = mailbox_->push_end([&](TransferEnd& e) {
    e.kind = t.kind;
    e.ok = t.state == TransferState::done;
    e.error = t.error;
    e.source_safe = source_safe;
    e.reason.assign(t.reason);
    e.spec = t.engine_spec;
  });
  // No record after the end (the transfer is terminal); the engine may
  // wait on the event until it has taken the end. A load failed by its
  // deadline (or cut short by shutdown) keeps its event for good: its
  // DeviceCopy may still be awaiting that event, and another load's record
  // of it would end that wait while the copy still runs. The Connector is
  // fail-stopped then; no load needs it again.
  if (t.queued_event != nullptr && !may_still_copy)
    queued_events_.give_back(std::exchange(t.queued_event, nullptr), receipt);
  check_fences();
}

bool TransferTable::fence_done(const Fence& f) const {
  if (f.all) return transfers_.empty();
  for (const std::string& r : f.requests)
    if (live_per_request_.contains(r)) return false;
  return true;
}

void TransferTable::fence(std::vector<std::string> requests, std::chrono::milliseconds timeout, bool all,
                          Handler h) {
  Fence f(next_fence_++, std::set<std::string>(requests.begin(), requests.end()), all, std::move(h));
  if (fence_done(f)) {
    complete(std::move(f.handler), fail_code_.value_or(std::error_code{}));
    return;
  }
  f.timer = std::make_unique<asio::steady_timer>(reactor_.strand(), timeout);
  f.timer->async_wait([self = shared_from_this(), id = f.id, timeout, all](const boost::system::error_code& ec) {
    if (ec) return;
    if (all) self->close_timed_out(id, timeout);
    else self->fence_timed_out(id, timeout);
  });
  fences_.push_back(std::move(f));
}

void TransferTable::check_fences() {
  for (auto it = fences_.begin(); it != fences_.end();) {
    if (!fence_done(*it)) {
      ++it;
      continue;
    }
    Handler h = std::move(it->handler);
    it = fences_.erase(it);
    complete(std::move(h), fail_code_.value_or(std::error_code{}));
  }
}

void TransferTable::fence_timed_out(std::uint64_t id, std::chrono::milliseconds timeout) {
  for (auto it = fences_.begin(); it != fences_.end(); ++it) {
    if (it->id != id) continue;
    std::string what = "kvstrand: fence timed out after " + std::to_string(timeout.count()) +
                       " ms with transfers still live:";
    for (const auto& t : transfers_)
      if (it->requests.contains(t->spec.request))
        what += " " + std::to_string(t->id) + " (" + to_string(t->kind) + " of '" + t->spec.request + "', " +
                to_string(t->state) + ")";
    set_fail_stop(TransferErrc::fence_timeout, what);
    Handler h = std::move(it->handler);
    fences_.erase(it);
    complete(std::move(h), TransferErrc::fence_timeout);
    return;
  }
}

// close() has waited its bound and transfers are still live: only a
// deadline that never fired leaves one so long. Each is failed and kept
// as stuck (the memory it names is never freed or reused by kvstrand),
// the fail-stop is set, and the log names every one.
void TransferTable::close_timed_out(std::uint64_t id, std::chrono::milliseconds bound) {
  if (std::none_of(fences_.begin(), fences_.end(), [id](const Fence& f) { return f.id == id; })) return;
  std::string names;
  std::vector<std::shared_ptr<Transfer>> abandoned(transfers_.begin(), transfers_.end());
  transfers_.clear();
  for (const auto& t : abandoned) {
    names += " " + std::to_string(t->id) + " (" + to_string(t->kind) + " of '" + t->spec.request + "', " +
             to_string(t->state) + ")";
    t->state = TransferState::failed;
    t->error = TransferErrc::deadline_exceeded;
    t->reason = "kvstrand: close() abandoned it after " + std::to_string(bound.count()) +
                " ms: its copy was never seen to end";
    stuck_[t->id] = t;
  }
  forget_ended_deadlines();
  const std::string what = "kvstrand: close() gave up after " + std::to_string(bound.count()) +
                           " ms on transfers still live (kept as stuck, their memory left alone):" + names;
  spdlog::error("{}", what);
  set_fail_stop(TransferErrc::deadline_exceeded, what);
  for (const auto& t : abandoned) deliver(*t);
  check_fences();
}

void TransferTable::complete(Handler h, std::error_code ec) { asio::dispatch(asio::append(std::move(h), ec)); }

std::vector<TransferInfo> TransferTable::snapshot() const {
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
  for (const auto& t : transfers_) add(*t, false);
  for (const auto& [id, t] : stuck_) add(*t, true);
  return out;
}

// ---- lookups, adoptions, releases ---------------------------------------------

void TransferTable::start_lookup(std::uint64_t id, std::uint32_t registration, std::vector<kv::ChunkKey> keys) {
  // A lookup whose coroutine threw is answered with a miss: every lookup
  // id gets its answer (the engine may be deferring a request on it).
  auto escaped = [self = shared_from_this(), id, registration](std::exception_ptr e) {
    if (!e) return;
    LogEscaped{"a lookup"}(e);
    self->mailbox_->push(LookupOutcome{id, {}, 0, registration});
  };
  if (!gate_.spawn(answer_lookup(shared_from_this(), id, registration, std::move(keys)), std::move(escaped)))
    mailbox_->push(LookupOutcome{id, {}, 0, registration});  // closing: a miss, still an answer
}

asio::awaitable<void> TransferTable::answer_lookup(std::shared_ptr<TransferTable> self, std::uint64_t id,
                                                   std::uint32_t registration, std::vector<kv::ChunkKey> keys) {
  const std::size_t asked = keys.size();
  index_plane::IndexPlane::LookupResult r = co_await self->tier_->index().lookup(registration, std::move(keys));
  const Registration* reg = self->tier_->index().registrations().find(registration);
  const std::uint32_t ct = reg ? reg->layout.chunk_tokens : 0;
  if (ct > 0) self->metrics_.lookup_answered(asked, r.hit.tokens / ct);
  const bool hit = r.hit.tokens > 0;
  self->mailbox_->push(LookupOutcome{id, std::move(r.hit), r.lease, registration});
  // A hit's load is the engine's next call: be polling when it comes.
  if (hit) self->reactor_.poller().kick();
}

void TransferTable::start_adopt(std::uint64_t id, std::uint32_t registration, std::uint64_t lease,
                                std::vector<kv::ChunkKey> keys) {
  auto escaped = [self = shared_from_this(), id, registration](std::exception_ptr e) {
    if (!e) return;
    LogEscaped{"a lease adoption"}(e);
    self->mailbox_->push(LookupOutcome{id, {}, 0, registration});
  };
  if (!gate_.spawn(answer_adopt(shared_from_this(), id, registration, lease, std::move(keys)), std::move(escaped)))
    mailbox_->push(LookupOutcome{id, {}, 0, registration});
}

asio::awaitable<void> TransferTable::answer_adopt(std::shared_ptr<TransferTable> self, std::uint64_t id,
                                                  std::uint32_t registration, std::uint64_t lease,
                                                  std::vector<kv::ChunkKey> keys) {
  index_plane::IndexPlane::LookupResult r = co_await self->tier_->index().adopt(registration, lease, std::move(keys));
  const bool hit = r.hit.tokens > 0;
  self->mailbox_->push(LookupOutcome{id, std::move(r.hit), r.lease, registration});
  if (hit) self->reactor_.poller().kick();
}

void TransferTable::start_release(std::uint64_t lease) {
  auto release = [](std::shared_ptr<TransferTable> self, std::uint64_t l) -> asio::awaitable<void> {
    co_await self->tier_->index().release_lookup(l);
  };
  // The completion holds the table too: the gate it leaves is the table's.
  (void)gate_.spawn(release(shared_from_this(), lease),
                   [self = shared_from_this()](std::exception_ptr e) { LogEscaped{"a lease release"}(e); });
}

// ---- registrations and close -------------------------------------------------------

asio::awaitable<index_plane::Failure> TransferTable::attach(Registration reg) {
  co_return co_await tier_->attach(std::move(reg));
}

void TransferTable::release_tier() {
  if (!stuck_.empty()) {
    spdlog::warn("kvstrand: close: {} transfer(s) never seen to end; the tier's memory is left allocated on purpose",
                 stuck_.size());
    device::keep_for_process_life(std::move(tier_));
    return;
  }
  tier_.reset();
}

asio::awaitable<void> TransferTable::settle(std::shared_ptr<TransferTable> self) {
  self->submissions_->poll();  // every transfer submitted before close() is one it waits for
  const auto bound = close_bound(self->deadline_) - std::chrono::milliseconds(500);
  const auto until = Clock::now() + bound;
  // Built before the co_await (GCC 12, docs/development.md).
  auto wait_all = [self, bound](auto handler) { self->fence({}, bound, true, Handler(std::move(handler))); };
  asio::use_awaitable_t<> token;
  std::error_code ec = co_await asio::async_initiate<decltype(token), void(std::error_code)>(wait_all, token);
  (void)ec;  // a fail-stop, if any, is already in the mailbox
  // A lookup waiting on the server ends with the tier's drain. A transfer
  // whose copy was never seen to end stays inside the gate for good (it is
  // kept as stuck): waiting for it would only spend the bound.
  co_await self->tier_->index().drain();
  const auto left = self->stuck_.empty() ? until - Clock::now() : Clock::duration{};
  const bool emptied = co_await self->gate_.close(left);
  if (!emptied && self->stuck_.empty())
    spdlog::warn("kvstrand: close: {} lookup(s) or release(s) still running at close's bound", self->gate_.inside());
}

}  // namespace kvstrand::connector
