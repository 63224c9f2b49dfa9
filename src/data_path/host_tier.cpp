#include "data_path/host_tier.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/load_trace.hpp"
#include "data_path/registration.hpp"
#include "device/keep_for_process_life.hpp"
#include "index_plane/transfer_error.hpp"

namespace kvstrand::data_path {

namespace asio = boost::asio;

namespace {
index_plane::Failure unwanted() {
  return {TransferErrc::deadline_exceeded, "the transfer ended (its deadline) before its copy was queued"};
}
index_plane::Failure not_attached(std::uint32_t registration) {
  return {TransferErrc::bad_spec, "registration " + std::to_string(registration) + " is not attached"};
}
}  // namespace

HostTier::HostTier(reactor::Reactor& reactor, std::unique_ptr<index_plane::IndexPlane> index)
    : reactor_(reactor), index_(std::move(index)) {}

HostTier::~HostTier() {
  // Only a copy never seen to end (a deadline fail-stop, a close that gave
  // up on it) can still be queued here. Waiting for it could be forever and
  // freeing under it would let it write freed memory: the streams and the
  // memory it may touch are kept for the life of the process instead.
  const auto busy = [](std::optional<device::Stream>& s) { return s && s->query().code() == device::Errc::not_ready; };
  if (busy(save_stream_) || busy(load_stream_)) kept_.push_back(index_->memory());
  if (kept_.empty()) return;
  spdlog::warn("kvstrand: the {} tier: a copy on its streams never ended; its streams and the memory that copy may "
               "touch are left allocated on purpose",
               index_->kind());
  for (auto& m : kept_) device::keep_shared_for_process_life(std::move(m));
  if (save_stream_) device::keep_for_process_life(std::move(*save_stream_));
  if (load_stream_) device::keep_for_process_life(std::move(*load_stream_));
}

asio::awaitable<index_plane::Failure> HostTier::attach(Registration reg) {
  if (!save_stream_) {
    auto saves = device::Stream::create();
    auto loads = device::Stream::create();
    for (const device::Status& s : {saves.status(), loads.status()})
      if (!s.ok())
        co_return index_plane::Failure{TransferErrc::device_error,
                                       std::string("the ") + index_->kind() + " tier's copy streams: " + s.describe()};
    save_stream_.emplace(std::move(saves).value());
    load_stream_.emplace(std::move(loads).value());
  }
  co_return co_await index_->attach(std::move(reg));
}

asio::awaitable<HostTier::Copy> HostTier::prepare(TransferKind kind, const kv::TransferSpec& spec,
                                                  Clock::time_point deadline) {
  Copy c(kind, spec, deadline);
  if (index_->registrations().find(spec.registration) == nullptr) {  // the Connector refuses such a spec before posting it
    c.outcome_.fail(not_attached(spec.registration));
    co_return c;
  }
  if (kind == TransferKind::save) {
    co_await prepare_save(c);
  } else {
    co_await prepare_load(c);
  }
  co_return c;
}

asio::awaitable<void> HostTier::prepare_save(Copy& c) {
  const kv::TransferSpec& s = *c.spec_;
  if (!index_->stores(s.registration)) co_return;  // another rank stores the one copy
  const Registration& reg = index_->registrations().at(s.registration);
  c.images_.assign(s.keys.size(), false);
  for (std::size_t i = 0; i < s.keys.size(); ++i)
    c.images_[i] = s.with_state && s.state_slots[i * reg.state_part_count()] >= 0;
  c.places_ = co_await index_->reserve(s.registration, s.keys, c.images_, s.chunk_events, c.deadline_);
  if (c.places_.failure) {
    c.outcome_.fail(std::move(c.places_.failure));
    co_return;
  }
  const auto& objects = c.places_.objects;
  c.has_copy_ = std::any_of(objects.begin(), objects.end(), [](std::byte* p) { return p != nullptr; });
  for (std::size_t i = 0; i < c.images_.size(); ++i) c.images_[i] = c.images_[i] && objects[i] != nullptr;
}

std::optional<HostTier::Copy> HostTier::prepare_now(TransferKind kind, const kv::TransferSpec& spec,
                                                    Clock::time_point deadline) {
  if (kind != TransferKind::load || index_->registrations().find(spec.registration) == nullptr) return std::nullopt;
  std::optional<index_plane::IndexPlane::Held> held = index_->hold_now(spec);
  if (!held) return std::nullopt;
  std::optional<Copy> c(Copy(kind, spec, deadline));
  c->held_ = std::move(*held);
  took(*c);
  return c;
}

asio::awaitable<void> HostTier::prepare_load(Copy& c) {
  c.held_ = co_await index_->hold(*c.spec_, c.deadline_);
  took(c);
}

void HostTier::took(Copy& c) {
  const kv::TransferSpec& s = *c.spec_;
  if (c.held_.failure) {
    c.outcome_.fail(std::move(c.held_.failure));
    return;
  }
  const auto& objects = c.held_.objects;
  const bool whole = objects.size() == s.keys.size() &&
                     std::none_of(objects.begin(), objects.end(), [](std::byte* p) { return p == nullptr; });
  if (!whole || (s.with_state && !c.held_.image_at_end)) {
    index_->release(s, c.held_);
    c.outcome_.fail({TransferErrc::missing_chunk, whole ? "no checkpoint image stored at the load's end"
                                                        : "the tier no longer holds every chunk of the load"});
    return;
  }
  c.has_copy_ = true;
  c.images_.assign(objects.size(), false);
  if (s.with_state) c.images_.back() = true;
}

device::Stream* HostTier::post(Copy& c, device::Event* after) {
  if (!c.to_post()) return nullptr;
  c.posted_ = true;
  const kv::TransferSpec& s = *c.spec_;
  const Registration& reg = index_->registrations().at(s.registration);
  const bool save = c.kind_ == TransferKind::save;
  segments_into(reg, s, save ? c.places_.objects : c.held_.objects, save, c.images_, planned_);
  c.copy_ = DeviceCopy::post(reactor_, save ? *save_stream_ : *load_stream_,
                             save ? device::CopyKind::device_to_host : device::CopyKind::host_to_device, planned_,
                             after);
  return c.copy_->queued() ? &c.copy_->stream() : nullptr;
}

// Not a coroutine itself: each kind's is the one frame a transfer's end
// takes here (a load's end is on its latency path, bench_transfer --trace).
asio::awaitable<TierOutcome> HostTier::complete(Copy c) {
  return c.kind_ == TransferKind::save ? complete_save(std::move(c)) : complete_load(std::move(c));
}

asio::awaitable<TierOutcome> HostTier::complete_save(Copy c) {
  if (!c.outcome_.error && c.has_copy_) co_await save_ended(c);
  if (!c.outcome_.error && c.places_.refused > 0)
    // The chunks that existed are not rewritten: no error for them.
    c.outcome_.fail({TransferErrc::tier_full, std::to_string(c.places_.refused) + " of " +
                                                  std::to_string(c.spec_->keys.size()) +
                                                  " chunks refused: every object is in use (tier full)"});
  co_return std::move(c.outcome_);
}

asio::awaitable<void> HostTier::save_ended(Copy& c) {
  const kv::TransferSpec& s = *c.spec_;
  if (!c.posted_) {  // not wanted any more: the places go back, nothing was written
    co_await index_->commit(s.registration, s.keys, c.places_, false, c.deadline_);
    c.outcome_.fail(unwanted());
    co_return;
  }
  CopyEnd copy = co_await c.copy_->wait();
  if (!copy.seen) {
    kept_.push_back(std::move(c.places_.memory));  // and the places stay held: the copy may still write them
    c.outcome_.fail(std::move(copy.failure));
    co_return;
  }
  const bool copied = !copy.failure;
  if (!copied) c.outcome_.fail(std::move(copy.failure));
  index_plane::Failure committed = co_await index_->commit(s.registration, s.keys, c.places_, copied, c.deadline_);
  if (copied && committed) c.outcome_.fail({committed.ec, "copied, but not committed: " + committed.why});
}

asio::awaitable<TierOutcome> HostTier::complete_load(Copy c) {
  if (c.outcome_.error || !c.has_copy_) co_return std::move(c.outcome_);
  const kv::TransferSpec& s = *c.spec_;
  if (!c.posted_) {  // not wanted any more: nothing was written into the engine's blocks
    index_->release(s, c.held_);
    c.outcome_.fail(unwanted());
    co_return std::move(c.outcome_);
  }
  CopyEnd copy = co_await c.copy_->wait();
  common::LoadTrace::mark(common::LoadTrace::seen);
  if (!copy.seen) {
    kept_.push_back(std::move(c.held_.memory));  // and the hold stays: the copy may still read those objects
    c.outcome_.fail(std::move(copy.failure));
    co_return std::move(c.outcome_);
  }
  index_->release(s, c.held_);  // the copy is done: nothing else needs the index for its outcome
  common::LoadTrace::mark(common::LoadTrace::released);
  if (copy.failure) c.outcome_.fail(std::move(copy.failure));
  co_return std::move(c.outcome_);
}

}  // namespace kvstrand::data_path
