// The one place the reactor strand hands results to the engine's thread.
//
// The strand pushes outcomes as transfers become terminal; the step thread
// drains them in finished() without waiting for the reactor. A mutex guards
// this handoff only (values, not transfer state): it is the boundary between
// the two threads, like the strand's own queue in the other direction.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "kv/hit_plan.hpp"
#include "kv/token_range.hpp"
#include "reactor/transfer.hpp"

namespace kvstrand::reactor {

struct TransferOutcome {
  std::string request;
  TransferKind kind = TransferKind::save;
  bool ok = false;
  std::error_code error;
  std::string reason;
  kv::TokenRange tokens;
  std::vector<kv::BlockId> blocks;  // a failed load: exactly the blocks it would have written
};

// Blocks of a save that the engine may reuse (the copy out of them is done).
struct SourceSafe {
  std::string request;
  std::vector<kv::BlockId> blocks;
};

struct LookupOutcome {
  std::uint64_t id = 0;
  kv::HitSource hit;
  // What keeps the hit stored until it is loaded: name it in the load's
  // spec (tier_lease), or give it back with Connector::release_lookup when
  // no load will. 0: the tier holds nothing for this lookup.
  std::uint64_t lease = 0;
};

struct Finished {
  std::vector<TransferOutcome> saves;
  std::vector<TransferOutcome> loads;
  std::vector<SourceSafe> source_safe;
  std::vector<LookupOutcome> lookups;

  bool empty() const noexcept { return saves.empty() && loads.empty() && source_safe.empty() && lookups.empty(); }
  std::vector<const TransferOutcome*> failed_loads() const;
};

struct FailStopState {
  std::error_code code;
  std::string what;
};

class Mailbox {
 public:
  void push(TransferOutcome o);
  void push(SourceSafe s);
  void push(LookupOutcome l);
  // Keeps the first fail-stop: later ones are consequences of it.
  void set_fail_stop(std::error_code code, std::string what);

  Finished drain();
  std::optional<FailStopState> fail_stop() const;
  // The transfers whose outcome is here, not yet drained: terminal.
  std::vector<std::pair<std::string, TransferKind>> terminal() const;

 private:
  mutable std::mutex m_;
  Finished pending_;
  std::optional<FailStopState> fail_;
};

}  // namespace kvstrand::reactor
