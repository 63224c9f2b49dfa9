// The interface every tier offers the reactor: one transfer path for all.
//
// Every member runs on the reactor strand. save() and load() are coroutines
// that queue the copies, mark the transfer `pending`, and complete when the
// copies are done; they complete with an error_code, never by throwing.
// A tier keeps every buffer a queued copy references alive until that copy
// completed, whatever happens to the transfer meanwhile (a deadline may make
// the transfer terminal for the engine while its copy still runs).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <span>
#include <vector>
#include <string>
#include <system_error>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/hit_plan.hpp>
#include "tier/index.hpp"
#include "reactor/registration.hpp"
#include "reactor/transfer.hpp"

namespace kvstrand::reactor {

// A tier's refusal: the code, and the words that say why (the server's own,
// the socket path, the OS error), which the Connector passes on to the
// engine once. An empty code is no refusal.
struct Refusal {
  std::error_code ec;
  std::string why;
  explicit operator bool() const noexcept { return static_cast<bool>(ec); }
};

class Tier {
 public:
  virtual ~Tier() = default;
  // Adds a registration; the tier numbers them in the order attached (0,
  // 1, ...), as specs and lookups name them. Each outlives the tier's use.
  virtual boost::asio::awaitable<Refusal> attach(const Registration& reg) = 0;
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
  virtual boost::asio::awaitable<std::error_code> save(Transfer& t) = 0;
  virtual boost::asio::awaitable<std::error_code> load(Transfer& t) = 0;
  virtual tier::Index::Stats stats() const = 0;
  // "local" (embedded), "node" (kvstrand-server), or what a custom tier says.
  virtual const char* kind() const noexcept { return "custom"; }
  // Called on the strand before the reactor stops: finish or abandon what
  // is in flight so nothing is left referencing the tier's memory.
  virtual boost::asio::awaitable<void> drain() = 0;
};

}  // namespace kvstrand::reactor
