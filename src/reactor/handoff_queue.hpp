// HandoffQueue<T>: the engine thread's way onto the strand without a lock or
// a wake-up in the common case.
//
// A bounded single-producer, single-consumer ring. The producer (the engine's
// thread: one thread at a time, as for every Connector call) push()es; the
// strand takes items on every Poller tick (it is a PollSource) and hands each
// to `consume`, in order. A push is its stores, one fence and a load; only
// when the poller has said it sleeps does the producer post a wake-up (the strand's
// mutex and the cross-CPU wake, tens of microseconds on a paravirtualised
// VM: docs/PERFORMANCE.md). The sleep handshake is Dekker's: the producer
// stores the item, fences (a read-modify-write of the tail), then reads
// `sleeping_`; the strand stores `sleeping_` then reads the ring, both
// sequentially consistent; at least one sees the other, so an item is
// never left in a ring nobody polls (a wake-up posted for an item already
// taken costs one idle tick). A batch (stage() each item, then notify())
// fences once.
//
// An item is consumed where it lies, by reference, and left in its slot:
// the producer's next emplace into that slot writes over it (a push swaps
// it back out), so what the consumer did not take (a vector's buffer)
// stays with the thread that allocated it, to be reused or freed there. Memory freed on the other
// thread is what made the engine's own allocations slower beside kvstrand
// (docs/PERFORMANCE.md).
//
// Items the strand must see before anything else the engine thread posts
// (a fence must cover every transfer submitted before it): every such post
// calls poll() first, on the strand.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "reactor/poller.hpp"
#include "reactor/spsc_ring.hpp"

namespace kvstrand::reactor {

template <class T>
class HandoffQueue final : public PollSource {
 public:
  // `capacity` is rounded up to a power of two.
  HandoffQueue(std::size_t capacity, Poller& poller, std::function<void(T&)> consume)
      : ring_(capacity), poller_(poller), consume_(std::move(consume)) {}

  // Producer. True: `item` is in the ring, and `item` now holds what that
  // slot held before (a consumed item, or T{}). False (and `item`
  // untouched) when the ring is full: the caller posts it another way,
  // after a poll() (so order is kept).
  bool push(T& item) {
    return emplace([&item](T& slot) {
      using std::swap;
      swap(slot, item);
    });
  }

  // Producer. True: `fill(slot)` has written the next item where it lies,
  // over what that slot held before (a consumed item, or T{}: the
  // producer's to reuse), and the item is in the ring. False (and `fill`
  // not called) when the ring is full. Writing in place moves no more of
  // the slot than `fill` writes: the lines the strand reads cross once.
  template <class Fill>
  bool emplace(Fill&& fill) {
    if (!stage(fill)) return false;
    notify();
    return true;
  }

  // Producer: emplace() without the wake-up check, for a batch of items;
  // notify() after the last one. The item is published at once (an awake
  // strand takes it on its next tick); a sleeping one is woken by notify().
  // The check costs a full fence, which waits until every store before it
  // (the slot's lines, owned by the strand's core since it read them) has
  // reached this core: once a batch instead of once an item
  // (docs/PERFORMANCE.md, "Step-thread cost").
  template <class Fill>
  bool stage(Fill&& fill) {
    return ring_.emplace(fill);
  }
  // Producer: before a batch of `n`, the first `bytes` of each slot it
  // will fill brought here for writing (SpscRing::prefetch_for_write).
  void prefetch(std::size_t n, std::size_t bytes) const noexcept { ring_.prefetch_for_write(n, bytes); }

  // Producer: wakes the strand if it said it sleeps, for everything staged
  // so far. The tail's sequentially consistent read-modify-write (a full
  // fence that TSan understands, which atomic_thread_fence is not) is the
  // producer's half of the sleep handshake: with sleep()'s sequentially
  // consistent store and load, either this reads `sleeping_` as set or the
  // strand reads the new tail.
  void notify() {
    ring_.fence_published();
    if (sleeping_.load(std::memory_order_seq_cst) && sleeping_.exchange(false, std::memory_order_seq_cst))
      poller_.wake();
  }

  // Strand: hands every item pushed so far to `consume`, in order. A poll
  // from inside `consume` finds nothing: the item it is in is not yet
  // released, and must not be handed out twice. An exception from
  // `consume` leaves poll() with that item dropped (as before it was
  // handed over) and the queue usable.
  bool poll() override {
    if (polling_ || ring_.empty()) return false;
    polling_ = true;
    struct Polling {
      bool& flag;
      ~Polling() { flag = false; }
    } polling{polling_};
    ring_.consume([this](T& item) { consume_(item); });
    return true;
  }

  bool sleep() override {
    sleeping_.store(true, std::memory_order_seq_cst);
    if (ring_.empty(std::memory_order_seq_cst)) return true;
    sleeping_.store(false, std::memory_order_relaxed);
    return false;
  }

  void awake() override {
    // Read first: a spinning poller calls this every tick, and a store
    // would pull the line from the producer's core each time.
    if (sleeping_.load(std::memory_order_relaxed)) sleeping_.store(false, std::memory_order_relaxed);
  }

 private:
  SpscRing<T> ring_;
  Poller& poller_;
  std::function<void(T&)> consume_;
  bool polling_ = false;  // the strand's only
  alignas(64) std::atomic<bool> sleeping_{true};  // a new queue's poller has not seen it yet: wake it
};

}  // namespace kvstrand::reactor
