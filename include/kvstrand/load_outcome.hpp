// How a planned load ended, and what each ending implies. The rules are data
// here so that every caller applies the same ones.
#pragma once

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand::kv {

enum class LoadOutcome {
  landed,     // the bytes (and state) arrived
  tier_lost,  // refused before submission: the tier no longer holds the prefix
  withdrawn,  // a promise not dispatched in time, dropped before submission
  failed,     // submitted, then failed (copy error, deadline, server gone)
};

// Only a submitted load that failed counts against the transfer path.
constexpr bool counts_as_transfer_failure(LoadOutcome o) noexcept { return o == LoadOutcome::failed; }

// A load that never reached the tier frees its lookup's lease itself
// (Connector::release_lookup); a submitted one's lease is released by the
// load once its copy is done.
constexpr bool frees_lookup_locks_directly(LoadOutcome o) noexcept {
  return o == LoadOutcome::tier_lost || o == LoadOutcome::withdrawn;
}

// Every load that did not land reopens [HBM hit, tier hit) for saving.
constexpr bool reopens_saves(LoadOutcome o) noexcept { return o != LoadOutcome::landed; }

}  // namespace kvstrand::kv
#pragma GCC visibility pop
