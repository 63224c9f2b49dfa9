// A level of kvstrand-server's storage below the arena (the disk, L2): what
// the arena commits is written behind to it, and what a lookup misses in
// the arena may be promoted from it. The server keeps its levels in order,
// nearest first (the disk, then L2); the request service writes to each and
// asks each in that order (RequestService::promote).
//
// On the server's strand, like everything it is given.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <kvstrand/chunk_keys.hpp>
#include "tier/index.hpp"

namespace kvstrand::server {

// Why a level's promotion stopped before the keys it was asked for, where
// it had something: a value refused by its checksum or MAC, or one that
// did not come in time (a read past --disk-timeout, a Redis node that did
// not answer). The server counts its lookups' misses by reason.
enum class LevelMiss : std::uint8_t { none, refused_value, timeout };
struct Promoted {
  std::size_t have = 0;  // how many of keys[0..] are in the arena now, in a row
  LevelMiss why = LevelMiss::none;
};

class LowerLevel {
 public:
  virtual ~LowerLevel() = default;

  // "disk", "L2": what the server's logs call it.
  virtual const char* name() const noexcept = 0;
  // Completions start being delivered (once the strand runs).
  virtual void start() = 0;
  // A reservation's objects (`slots` of `index`) were just committed: each
  // is queued to be written behind, or dropped and counted; never waited for.
  virtual void committed(tier::Index& index, std::span<const std::uint32_t> slots) = 0;
  // Copies into the arena the run of `keys` (from keys[0]) that this level
  // holds, bounded by the level's own timeout; the objects are `tenant`'s
  // (the asking registration's: the keys' namespace is its own).
  virtual boost::asio::awaitable<Promoted> promote(tier::Index& index, std::vector<kv::ChunkKey> keys,
                                                   tier::TenantId tenant) = 0;
  // Drops every object of namespace `ns` this level holds or has queued to
  // write; none is promoted after. Returns how many it dropped.
  virtual std::size_t drop(const kv::Digest& ns) = 0;
  // Adds the namespaces this level holds objects of tenant `name` in (it
  // keeps their tenants; L2 does not).
  virtual void tenant_namespaces(const std::string& /*name*/, std::set<kv::Digest>& /*out*/) const {}
  // Waits until everything queued is written (or failed), at most `bound`;
  // returns how many objects were still queued or in flight.
  virtual boost::asio::awaitable<std::size_t> drain(std::chrono::milliseconds bound) = 0;
  // Stops: nothing more is queued or started; waits, at most `bound`, for
  // what runs.
  virtual boost::asio::awaitable<void> close(std::chrono::milliseconds bound) = 0;
};

}  // namespace kvstrand::server
