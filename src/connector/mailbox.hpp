// The one place the reactor strand hands results to the engine's thread.
//
// The strand pushes transfers' ends (and lookup answers) as they come; the
// step thread drains them in finished() without waiting for the reactor.
// Ends, one or more every step, go through a lock-free single-producer
// ring; lookup answers, the fail-stop and ends past a full ring, rarer,
// through a mutex that guards only them (values, not transfer state): the
// boundary between the two threads, like the submission ring in the other
// direction.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <kvstrand/finished.hpp>
#include "reactor/spsc_ring.hpp"
#include "connector/transfer.hpp"

namespace kvstrand::connector {

using kvstrand::Finished;
using kvstrand::LoadOrder;
using kvstrand::LookupOutcome;
using kvstrand::SourceSafe;
using kvstrand::TransferOutcome;

struct FailStopState {
  std::error_code code;
  std::string what;
};

// A transfer's end as the strand hands it over: a small record naming the
// engine's own spec. The engine's thread makes the TransferOutcome (and the
// SourceSafe notice) from its own memory in finished(), and frees it there:
// the strand never reads, writes, allocates or frees the engine's specs.
// Memory crossing the two threads made the engine's own code slower beside
// kvstrand (docs/PERFORMANCE.md, "Step-thread cost").
struct TransferEnd {
  TransferKind kind = TransferKind::save;
  bool ok = false;
  // A save whose copy out of its blocks is known to have ended (done,
  // failed, or never queued): its blocks may be reused.
  bool source_safe = false;
  std::error_code error;
  // Empty unless it failed. Copied out, never moved: a ring slot's buffer
  // stays the strand's (an end past the ring is freed by the engine's
  // thread, a rare case).
  std::string reason;
  const kv::TransferSpec* spec = nullptr;  // the engine's (Transfer::engine_spec): read on the engine's thread only
};

// Where push_end put an end, for the strand to ask later whether the
// engine's thread has taken it (Mailbox::taken).
struct EndReceipt {
  bool in_ring = true;
  std::uint64_t at = 0;  // its index in the ring; behind the lock: the overflow's drains when it was pushed
};

// What waits behind the mailbox's lock, taken in one drain: the engine's,
// reused from call to call (its vectors trade places with the mailbox's).
struct Drained {
  std::vector<TransferEnd> ends;  // ends that found the ring full
  std::vector<LookupOutcome> lookups;
};

class Mailbox {
 public:
  // Ends in the ring before any waits behind the lock: enough for the
  // transfers a few steps end, few enough that its lines stay in cache.
  static constexpr std::size_t kEndSlots = 256;

  Mailbox() : ends_(kEndSlots) {}

  // Strand: fill(end) writes every field of the next end, over the ring
  // slot's old one (whose reason's buffer it may reuse) or, the ring full,
  // into a new one behind the lock. Ends carry no order among themselves.
  template <class Fill>
  EndReceipt push_end(Fill&& fill) {
    const std::uint64_t at = ends_.next_index();
    if (ends_.emplace(fill)) return {true, at};
    std::lock_guard lk(m_);
    fill(overflow_.emplace_back());
    pending_flag_.store(true, std::memory_order_release);
    return {false, overflow_drains_.load(std::memory_order_relaxed)};
  }
  // Strand: whether the engine's thread has taken the end `r` names. An
  // end in the ring is taken once the engine has handled it and given its
  // slot back; one behind the lock once drain_locked() swapped it out (the
  // engine handles it before that finished() returns). Nothing the engine's
  // thread writes for this alone: the ring's head and a drain count.
  bool taken(EndReceipt r) const noexcept {
    return r.in_ring ? ends_.consumed() > r.at : overflow_drains_.load(std::memory_order_acquire) > r.at;
  }
  void push(LookupOutcome l);
  // Keeps the first fail-stop: later ones are consequences of it.
  void set_fail_stop(std::error_code code, std::string what);

  // The rest run on the engine's thread only: they read the specs the ends
  // name.
  //
  // Whether an end or an answer waits, or a fail-stop is set: two atomic
  // loads, no lock (a push racing it is seen by the next call).
  bool pending() const noexcept {
    return !ends_.empty() || pending_flag_.load(std::memory_order_acquire);
  }
  // Swaps what waits behind the lock into `into`, whose vectors must be
  // empty; no lock when nothing does (the common case).
  void drain_locked(Drained& into);
  // f(const TransferEnd&) for each end waiting in the ring, left in place;
  // returns how many.
  template <class F>
  std::size_t peek_ends(F f) const {
    return ends_.peek(f);
  }
  // f(TransferEnd&) for each of the first `n` ends waiting in the ring (n
  // from peek_ends), each slot then given back to the strand.
  template <class F>
  void drain_ends(std::size_t n, F f) {
    ends_.consume(f, n);
  }
  std::optional<FailStopState> fail_stop() const;
  // Whether a fail-stop is set: one atomic load, no lock (the step thread's
  // calls check it first and lock only to read it).
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  // The transfers whose outcome is here, not yet drained: terminal.
  std::vector<TransferKey> terminal() const;

 private:
  reactor::SpscRing<TransferEnd> ends_;
  mutable std::mutex m_;
  // Written under m_: true while overflow_ or lookups_ is not empty or
  // fail_ is set.
  std::atomic<bool> pending_flag_{false};
  std::atomic<bool> failed_{false};  // written under m_, once fail_ is set
  std::atomic<std::uint64_t> overflow_drains_{0};  // drains that took overflow_ (written under m_)
  std::vector<TransferEnd> overflow_;
  std::vector<LookupOutcome> lookups_;
  std::optional<FailStopState> fail_;
};

}  // namespace kvstrand::connector
