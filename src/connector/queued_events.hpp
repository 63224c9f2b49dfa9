// QueuedEvents: the strand's "copies queued" events, one lent to each live
// load (Connector::order_after_load).
//
// The strand records a load's event once the load's copies are queued and
// names it in the engine's live entry for the load; the engine may make its
// stream wait on it until it drains the load's end in finished(). So the
// event may not be recorded for another load before that: it comes back to
// the pool only once the Mailbox says the engine's thread has taken the end
// (Mailbox::taken). The engine's thread writes nothing for this: a shared
// reference count released on that thread was a cache line pulled from the
// strand's core on every drained load (docs/PERFORMANCE.md, "Step-thread
// cost").
//
// Strand only.
#pragma once

#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "device/event.hpp"
#include "connector/mailbox.hpp"

namespace kvstrand::connector {

class QueuedEvents {
 public:
  explicit QueuedEvents(const Mailbox& mailbox) : mailbox_(mailbox) {}

  // A free event (one made when none is free); none if the device cannot
  // make one.
  device::Event* lend() {
    // Only when none is free: collect() reads the ring's head, a line the
    // engine's thread writes on every drain.
    if (free_.empty()) collect();
    if (!free_.empty()) {
      device::Event* e = free_.back();
      free_.pop_back();
      return e;
    }
    auto made = device::Event::create();
    if (!made.ok()) return nullptr;
    return all_.emplace_back(std::make_unique<device::Event>(std::move(made).value())).get();
  }

  // `e` is free again once the end `r` names has been taken.
  void give_back(device::Event* e, EndReceipt r) { (r.in_ring ? in_ring_ : in_overflow_).emplace_back(e, r); }

  // Events made so far (each lent to at most one load at a time).
  std::size_t made() const noexcept { return all_.size(); }

 private:
  // Receipts of one kind are taken in the order they were given.
  void collect() {
    for (auto* q : {&in_ring_, &in_overflow_})
      while (!q->empty() && mailbox_.taken(q->front().second)) {
        free_.push_back(q->front().first);
        q->pop_front();
      }
  }

  const Mailbox& mailbox_;
  std::vector<std::unique_ptr<device::Event>> all_;
  std::vector<device::Event*> free_;
  std::deque<std::pair<device::Event*, EndReceipt>> in_ring_, in_overflow_;
};

}  // namespace kvstrand::connector
