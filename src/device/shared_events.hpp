// Events handed out shared, and reused once only this pool still holds them.
//
// For events whose last user is not known in advance: a transfer's producer
// (held until the reactor has seen it complete), a load's copies-queued
// event (held until its outcome is drained). An event is taken again only
// when its use count is 1, so no one can still query or wait on it. One
// thread owns a pool (the engine's, or the reactor's strand); the count may
// drop on another, which only makes an event reusable a little later.
#pragma once

#include <memory>
#include <vector>

#include "device/event.hpp"

namespace kvstrand::device {

class SharedEvents {
 public:
  // A free event, or a new one.
  Result<std::shared_ptr<Event>> acquire() {
    for (auto& e : events_)
      if (e.use_count() == 1) return e;
    auto made = Event::create();
    if (!made.ok()) return made.status();
    return events_.emplace_back(std::make_shared<Event>(std::move(made).value()));
  }

 private:
  std::vector<std::shared_ptr<Event>> events_;
};

}  // namespace kvstrand::device
