// The one place the reactor strand hands results to the engine's thread.
//
// The strand pushes transfers' ends (and lookup answers) as they come; the
// step thread drains them in finished() without waiting for the reactor. A
// mutex guards this handoff only (values, not transfer state): it is the
// boundary between the two threads, like the strand's own queue in the
// other direction.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <kvstrand/finished.hpp>
#include "reactor/spare_nodes.hpp"
#include "reactor/transfer.hpp"

namespace kvstrand::reactor {

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
  std::string reason;  // empty unless it failed
  const kv::TransferSpec* spec = nullptr;  // the engine's (Transfer::engine_spec): read on the engine's thread only
};

// What one drain takes: the engine's, reused from call to call so that a
// drain allocates nothing once warm (the vectors are swapped, not made).
struct Drained {
  std::vector<TransferEnd> ends;
  std::vector<LookupOutcome> lookups;
};

class Mailbox {
 public:
  void push(TransferEnd e);
  void push(LookupOutcome l);
  // Keeps the first fail-stop: later ones are consequences of it.
  void set_fail_stop(std::error_code code, std::string what);

  // Swaps what is pending into `into`, whose vectors must be empty (their
  // capacity is what the strand pushes into next). This and terminal() run
  // on the engine's thread only: they read the specs the ends name.
  void drain(Drained& into);
  // Whether drain() would return anything, or a fail-stop is set: one
  // atomic load, no lock (a push racing it is seen by the next call).
  bool pending() const noexcept { return pending_flag_.load(std::memory_order_acquire); }
  std::optional<FailStopState> fail_stop() const;
  // Whether a fail-stop is set: one atomic load, no lock (the step thread's
  // calls check it first and lock only to read it).
  bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
  // The transfers whose outcome is here, not yet drained: terminal.
  std::vector<TransferKey> terminal() const;
  // A load's copies are queued, `event` recorded after them. Kept until
  // that load's outcome is drained.
  void push_queued(const std::string& request, std::uint32_t registration, std::shared_ptr<const hip::Event> event);
  std::shared_ptr<const hip::Event> queued(const std::string& request, std::uint32_t registration) const;

 private:
  mutable std::mutex m_;
  std::atomic<bool> pending_flag_{false};
  std::atomic<bool> failed_{false};  // written under m_, once fail_ is set
  Drained pending_;  // pending_flag_: written under m_, true while this is not empty or fail_ is set
  std::optional<FailStopState> fail_;
  // Keyed by request and registration (kind: always load). A drained load's
  // node is kept for the next push_queued, up to a bound: the strand makes
  // them and the engine's thread ends them.
  using QueuedMap = std::map<TransferKey, std::shared_ptr<const hip::Event>, TransferKeyLess>;
  QueuedMap queued_;
  SpareNodes<QueuedMap> spare_queued_;
};

}  // namespace kvstrand::reactor
