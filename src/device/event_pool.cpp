#include "device/event_pool.hpp"

#include "device/keep_for_process_life.hpp"

#include <spdlog/spdlog.h>

#include <cstdlib>

namespace kvstrand::device {

EventPool::Lease::Lease(Lease&& o) noexcept
    : pool_(std::exchange(o.pool_, nullptr)), slot_(std::move(o.slot_)) {}

EventPool::Lease& EventPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = std::exchange(o.pool_, nullptr);
    slot_ = std::move(o.slot_);
  }
  return *this;
}

EventPool::Lease::~Lease() { release(); }

void EventPool::Lease::release() noexcept {
  if (pool_ != nullptr && slot_) pool_->take_back(std::move(slot_));
  pool_ = nullptr;
}

Status EventPool::Lease::record(Stream& s) {
  Status st = slot_->event.record(s);
  if (st.ok()) {
    ++slot_->records;
    ++pool_->stats_.records;
    pool_->stats_.max_records_one = std::max(pool_->stats_.max_records_one, slot_->records);
  }
  return st;
}

EventPool::EventPool() : EventPool(Options{}) {}
EventPool::EventPool(Options options) : options_(options) {}

EventPool::~EventPool() {
  if (stats_.in_use != 0) {
    // A Lease that outlives its pool would write into freed memory later.
    spdlog::critical("kvstrand: EventPool destroyed with {} events still leased", stats_.in_use);
    std::abort();
  }
  // Teardown never waits on the device: an event still pending (a stream
  // that never finished, after a deadline fail-stop) is left alive on
  // purpose rather than destroyed under a copy or waited for.
  std::size_t left = 0;
  for (auto& slot : retiring_) {
    if (slot->event.query().code() == Errc::not_ready) {
      keep_for_process_life(std::move(slot));
      ++left;
      continue;
    }
    destroy(std::move(slot));
  }
  if (left != 0)
    spdlog::warn("kvstrand: {} event(s) still pending on a stream that never finished: left alive on purpose", left);
  for (auto& slot : idle_) destroy(std::move(slot));
}

bool EventPool::on_owner_thread() {
  const auto me = std::this_thread::get_id();
  if (owner_ == std::thread::id{}) owner_ = me;
  return owner_ == me;
}

Status EventPool::warm_up() {
  if (!on_owner_thread()) return {Errc::wrong_executor, "EventPool::warm_up"};
  while (idle_.size() < options_.warm) {
    auto ev = Event::create();
    if (!ev.ok()) return ev.status();
    idle_.push_back(std::make_unique<Slot>(Slot{std::move(ev).value(), 0}));
    ++stats_.created;
  }
  return {};
}

void EventPool::reclaim() {
  std::size_t kept = 0;
  for (auto& slot : retiring_) {
    Status q = slot->event.query();
    if (q.code() == Errc::not_ready) {
      retiring_[kept++] = std::move(slot);
    } else if (!q.ok() || (options_.max_records != 0 && slot->records >= options_.max_records)) {
      // Complete but not reusable: it saw a failure, or used up its records.
      destroy(std::move(slot));
    } else {
      idle_.push_back(std::move(slot));
    }
  }
  retiring_.resize(kept);
}

Result<EventPool::Lease> EventPool::acquire() {
  if (!on_owner_thread()) return Status{Errc::wrong_executor, "EventPool::acquire", "not the pool's owning thread"};
  if (idle_.empty()) reclaim();
  std::unique_ptr<Slot> slot;
  if (!idle_.empty()) {
    slot = std::move(idle_.back());
    idle_.pop_back();
    ++stats_.reused;
  } else {
    auto ev = Event::create();
    if (!ev.ok()) return ev.status();
    slot = std::make_unique<Slot>(Slot{std::move(ev).value(), 0});
    ++stats_.created;
  }
  ++stats_.acquired;
  ++stats_.in_use;
  return Lease(this, std::move(slot));
}

void EventPool::take_back(std::unique_ptr<Slot> slot) noexcept {
  if (!on_owner_thread()) {
    spdlog::critical("kvstrand: an EventPool lease was released off the pool's owning thread");
    std::abort();
  }
  --stats_.in_use;
  retiring_.push_back(std::move(slot));
}

void EventPool::destroy(std::unique_ptr<Slot> slot) noexcept {
  slot.reset();
  ++stats_.destroyed;
}

EventPool::Stats EventPool::stats() const {
  Stats s = stats_;
  s.live = static_cast<std::size_t>(stats_.created - stats_.destroyed);
  s.idle = idle_.size();
  s.retiring = retiring_.size();
  return s;
}

}  // namespace kvstrand::device
