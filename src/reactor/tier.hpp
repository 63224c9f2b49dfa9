// The interface every tier offers the reactor: one transfer path for all.
//
// Every member runs on the reactor strand. save() and load() are coroutines
// that queue the copies, say so through the job's `queued`, and complete
// when the copies are done; they complete with an outcome, never by
// throwing, and never touch the reactor's Transfer (only the reactor writes
// it, from the outcome).
// A tier keeps every buffer a queued copy references alive until that copy
// completed, whatever happens to the transfer meanwhile (a deadline may make
// the transfer terminal for the engine while its copy still runs).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <functional>
#include <span>
#include <vector>
#include <string>
#include <system_error>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/hit_plan.hpp>
#include <kvstrand/transfer_spec.hpp>
#include "hip/stream.hpp"
#include "reactor/failure.hpp"
#include "reactor/registration.hpp"
#include "tier/index.hpp"

namespace kvstrand::reactor {

// What a tier's save or load is given: the spec, the time by which the
// engine wants it, and who to tell once its copies are queued.
struct TierJob {
  const kv::TransferSpec& spec;
  std::chrono::steady_clock::time_point deadline;
  // Called on the strand, at most once, when the copies are queued on
  // `stream` (the reactor marks the transfer pending; a load's "queued"
  // event is recorded on that stream).
  std::function<void(hip::Stream&)> queued;
  // Whether the copy is still wanted: false once the reactor failed the
  // transfer (its deadline passed while the tier waited for its index).
  // Checked before any copy is queued; a copy no one waits for must not
  // write blocks the engine was told about.
  std::function<bool()> wanted;
};

// What became of a save or a load. operation_canceled: the wait ended
// (shutdown) without the copy seen to end, so every buffer it references
// is left alone for good.
struct TierOutcome {
  std::error_code error;
  std::string reason;  // with error: what happened, for the engine (a save's refused chunks are counted here)

  void fail(Failure f) {
    error = f.ec;
    reason = std::move(f.why);
  }
};

class Tier {
 public:
  virtual ~Tier() = default;
  // Adds a registration; the tier numbers them in the order attached (0,
  // 1, ...), as specs and lookups name them. Each outlives the tier's use.
  virtual boost::asio::awaitable<Failure> attach(const Registration& reg) = 0;
  // Longest run of consecutive stored chunks from keys[0], with the image
  // boundaries within it, and the lease that keeps it stored (0: none; the
  // embedded tier leases nothing at lookup, its loads pin what they read).
  // A coroutine: the node tier asks its server.
  struct LookupResult {
    kv::HitSource hit;
    std::uint64_t lease = 0;
  };
  virtual boost::asio::awaitable<LookupResult> lookup(std::uint32_t registration, std::vector<kv::ChunkKey> keys) = 0;
  // A lookup's lease that no load will name: free it now (F20).
  virtual boost::asio::awaitable<void> release_lookup(std::uint64_t /*lease*/) { co_return; }
  // A lease another process exported (Connector::adopt_lease): made this
  // process's, answered like a lookup of `keys`; a miss when it is gone.
  virtual boost::asio::awaitable<LookupResult> adopt(std::uint32_t /*registration*/, std::uint64_t /*lease*/,
                                                     std::vector<kv::ChunkKey> /*keys*/) {
    co_return LookupResult{};
  }
  // A lease this process exported: no longer its to release (the server
  // still ends it with this process's session, until it is adopted).
  virtual void forget_lease(std::uint64_t /*lease*/) {}
  virtual boost::asio::awaitable<TierOutcome> save(TierJob job) = 0;
  virtual boost::asio::awaitable<TierOutcome> load(TierJob job) = 0;
  virtual tier::Index::Stats stats() const = 0;
  // "local" (embedded), "node" (kvstrand-server), or what a custom tier says.
  virtual const char* kind() const noexcept { return "custom"; }
  // Called on the strand before the reactor stops: finish or abandon what
  // is in flight so nothing is left referencing the tier's memory.
  virtual boost::asio::awaitable<void> drain() = 0;
};

}  // namespace kvstrand::reactor
