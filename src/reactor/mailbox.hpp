// The one place the reactor strand hands results to the engine's thread.
//
// The strand pushes outcomes as transfers become terminal; the step thread
// drains them in finished() without waiting for the reactor. A mutex guards
// this handoff only (values, not transfer state): it is the boundary between
// the two threads, like the strand's own queue in the other direction.
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

class Mailbox {
 public:
  void push(TransferOutcome o);
  void push(SourceSafe s);
  void push(LookupOutcome l);
  // Keeps the first fail-stop: later ones are consequences of it.
  void set_fail_stop(std::error_code code, std::string what);

  Finished drain();
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
  std::atomic<bool> failed_{false};  // written under m_, once fail_ is set  // written under m_: pending_ is not empty, or fail_ is set
  Finished pending_;
  std::optional<FailStopState> fail_;
  std::map<std::pair<std::string, std::uint32_t>, std::shared_ptr<const hip::Event>> queued_;
};

}  // namespace kvstrand::reactor
