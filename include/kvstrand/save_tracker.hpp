// Per-request save bookkeeping on the scheduler side: which prefix of the
// prompt the tier is known to hold (the frontier), and what to save next.
//
// Rules (each pinned by a test in tests/kv/test_save_tracker.cpp):
// - At most one save in flight per request; none while the request loads.
// - A save covers [frontier, committed) floored to the chunk grid: only full
//   chunks whose KV and checkpoint are committed.
// - The save floor is recorded once, when a load is decided (the load's
//   begin, the HBM hit). Every load that does not land lowers the frontier
//   to it again: [HBM hit, tier hit) is saved again.
// - A request gets one tier attempt: once a load is decided (or a promise
//   withdrawn) no second one is planned.
// - A failed save leaves its range open to be tried again; abandon() gives
//   ranges up explicitly. Every range ends saved or abandoned.
#pragma once

#include <cstdint>
#include <optional>

#include <kvstrand/load_outcome.hpp>
#include <kvstrand/token_range.hpp>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand::kv {

class SaveTracker {
 public:
  explicit SaveTracker(std::uint32_t chunk_tokens) : chunk_(chunk_tokens) {}

  // A lookup found [0, tokens) already stored: nothing below needs saving.
  void note_stored(std::uint32_t tokens);

  // A tier load was decided. Spends the tier attempt; records the floor once.
  void load_decided(TokenRange load);
  // A promised load was withdrawn before it was decided as a transfer: the
  // attempt is spent too (no re-promise loop).
  void spend_tier_attempt() noexcept { tier_attempt_spent_ = true; }
  void load_settled(LoadOutcome outcome);

  std::optional<TokenRange> next_save(std::uint32_t committed_tokens);
  void save_settled(bool ok);
  // Gives up saving below `end` (e.g. the request finished and its tail save
  // was retired, or the tier refused it for good).
  void abandon(std::uint32_t end);

  std::uint32_t frontier() const noexcept { return frontier_; }
  std::optional<std::uint32_t> save_floor() const noexcept { return floor_; }
  bool tier_attempt_spent() const noexcept { return tier_attempt_spent_; }
  bool loading() const noexcept { return loading_; }
  std::optional<TokenRange> save_in_flight() const noexcept { return in_flight_; }

 private:
  std::uint32_t chunk_;
  std::uint32_t frontier_ = 0;  // the tier holds (or we gave up on) [0, frontier_)
  std::optional<std::uint32_t> floor_;
  std::optional<TokenRange> in_flight_;
  bool loading_ = false;
  bool tier_attempt_spent_ = false;
};

}  // namespace kvstrand::kv
#pragma GCC visibility pop
