// The strand's "copies queued" events: one is lent to no other load until
// the engine's thread has taken the end it was given back with, whether
// that end went into the Mailbox's ring or waited behind its lock.
#include <set>

#include "connector/queued_events.hpp"
#include "support.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using connector::EndReceipt;
using connector::Mailbox;
using connector::QueuedEvents;
using connector::TransferEnd;

namespace {

EndReceipt push_one(Mailbox& m) {
  return m.push_end([](TransferEnd& e) { e.ok = true; });
}

}  // namespace

TEST_CASE("queued events: one given back with an end in the ring comes back once the engine took the end",
          "[reactor][gpu]") {
  if (!device_present()) return;
  Mailbox m;
  QueuedEvents q(m);
  device::Event* a = q.lend();
  REQUIRE(a != nullptr);
  const EndReceipt r = push_one(m);
  REQUIRE(r.in_ring);
  q.give_back(a, r);
  REQUIRE_FALSE(m.taken(r));
  device::Event* b = q.lend();  // the end is not taken yet: another one
  REQUIRE(b != a);
  REQUIRE(q.made() == 2);
  // Read but not given back (peek) is not taken.
  REQUIRE(m.peek_ends([](const TransferEnd&) {}) == 1);
  REQUIRE_FALSE(m.taken(r));
  m.drain_ends(1, [](TransferEnd&) {});
  REQUIRE(m.taken(r));
  REQUIRE(q.lend() == a);  // back, and nothing new made
  REQUIRE(q.made() == 2);
}

TEST_CASE("queued events: one given back with an end behind the lock (the ring full) comes back once drained",
          "[reactor][gpu]") {
  if (!device_present()) return;
  Mailbox m;
  QueuedEvents q(m);
  std::vector<EndReceipt> in_ring;
  for (std::size_t i = 0; i < Mailbox::kEndSlots; ++i) in_ring.push_back(push_one(m));
  device::Event* a = q.lend();
  const EndReceipt r = push_one(m);
  REQUIRE_FALSE(r.in_ring);
  q.give_back(a, r);
  device::Event* b = q.lend();
  q.give_back(b, in_ring.back());
  std::set<device::Event*> lent{q.lend(), q.lend()};
  REQUIRE_FALSE(lent.contains(a));  // neither end taken
  REQUIRE_FALSE(lent.contains(b));
  connector::Drained d;
  m.drain_locked(d);  // what waits behind the lock: the last end only
  REQUIRE(d.ends.size() == 1);
  REQUIRE(m.taken(r));
  REQUIRE_FALSE(m.taken(in_ring.back()));
  REQUIRE(q.lend() == a);
  REQUIRE(q.made() == 4);
  m.drain_ends(m.peek_ends([](const TransferEnd&) {}), [](TransferEnd&) {});
  REQUIRE(m.taken(in_ring.front()));
  REQUIRE(q.lend() == b);
  REQUIRE(q.made() == 4);
}
