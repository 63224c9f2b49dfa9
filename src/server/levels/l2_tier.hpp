// The node server's second tier: Redis (Cluster) under the arena, host to
// host. Committed objects are written behind to it; a lookup that misses
// the arena asks it for the run of chunks after the arena's hit and copies
// what it finds into the arena before the lookup is answered.
//
// - Write-behind never delays a reply: commit queues the objects (each
//   pinned in the index until its bytes are taken, so it cannot be evicted
//   or reused under the copy) and returns. The queue holds at most
//   max_inflight objects; what does not fit is dropped and counted.
// - A lookup's L2 part is one pipelined GET of every key after the hit,
//   bounded by `timeout`: what has not come by then is a miss.
// - A value is loaded only if its header names exactly this chunk (namespace,
//   rank, hash), this object size and format, and both checksums match
//   (l2/chunk_value.hpp); anything else is a miss, counted. Its KV-event
//   description (--events) travels beside it, under a key of its own: one
//   that description_problem refuses is dropped and counted, the value
//   still loads.
// - Redis unreachable at start: the server serves without it and keeps
//   trying every second. Redis refusing the credentials: the same, with an
//   error naming the options that set them.
// - A server stopping (SIGTERM) first drains the write queue, for at most a
//   few seconds: another node may be about to ask for what it committed.
//
// Everything runs on the server's strand.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "l2/chunk_value.hpp"
#include "l2/redis_cluster.hpp"
#include "common/strand.hpp"
#include "server/levels/lower_level.hpp"
#include "tier/index.hpp"
#include "tier/size_classes.hpp"

namespace kvstrand::server {

class TierEvents;

struct L2Options {
  std::vector<l2::RedisAddress> seeds;
  std::chrono::milliseconds timeout{100};
  std::size_t max_inflight = 256;  // objects queued for writing; commands unanswered per Redis node
  std::chrono::seconds ttl{0};     // 0: no expiry (Redis's maxmemory policy evicts)
  l2::RedisCredentials credentials;  // --l2-user, --l2-password-file or KVSTRAND_L2_PASSWORD
  std::optional<l2::MacKey> mac;     // --l2-mac-key-file: values carry a MAC under it, and must
};

struct L2Stats {
  bool connected = false;     // a slot map was learned
  bool auth_refused = false;  // the last attempt: Redis refused the credentials
  std::uint64_t written = 0;
  std::uint64_t write_failed = 0;
  std::uint64_t write_dropped = 0;  // the queue was full
  std::uint64_t promoted = 0;        // chunks copied from L2 into the arena
  std::uint64_t lookups = 0;         // lookups that asked L2
  std::uint64_t lookup_misses = 0;   // ... and found nothing after the arena's hit
  std::uint64_t bad_values = 0;      // refused: header, length or checksum (then deleted from Redis)
  std::uint64_t bad_values_deleted = 0;
  std::uint64_t unauthenticated = 0;  // refused by their MAC (or its absence); left in Redis
  std::uint64_t error_replies = 0;   // GETs Redis answered with an error (CLUSTERDOWN, WRONGTYPE, ...)
  std::uint64_t unanswered = 0;      // GETs with no answer in time (timeout, node down)
  std::uint64_t purged = 0;          // values deleted by namespace drops
  std::uint64_t purge_failed = 0;    // attempts of a drop's purge that could not scan a master to its end (retried)
  std::uint64_t purges_skipped = 0;  // drops of a namespace no node ever wrote to L2: no scan
  std::size_t purges_pending = 0;    // drops whose purge has not ended yet (those namespaces are not promoted)
  std::size_t queue = 0;
  l2::RedisClusterStats redis;
};

class L2Tier final : public LowerLevel {
 public:
  // `arena`: the server's mapping of the whole arena.
  L2Tier(common::Strand strand, L2Options options, std::byte* arena, tier::SizeClasses& classes);
  ~L2Tier();
  L2Tier(const L2Tier&) = delete;
  L2Tier& operator=(const L2Tier&) = delete;

  const char* name() const noexcept override { return "L2"; }
  void start() override;
  // Waits until every queued object is written (or failed), at most
  // `bound`; returns how many were still queued or in flight.
  boost::asio::awaitable<std::size_t> drain(std::chrono::milliseconds bound) override;
  // Stops connecting and writing, waits (at most `bound`) for its coroutines
  // to end, then closes the Redis connections. On the strand.
  boost::asio::awaitable<void> close(std::chrono::milliseconds bound) override;
  // The same without waiting (the destructor's): the connections close now.
  void stop();

  // With --events: each object written carries its description (under
  // l2::redis_description_key_of), and an object promoted with one is
  // announced in the arena as any other described object.
  void set_events(TierEvents* events);
  // A reservation's objects (`slots`) were just committed: queue them.
  void committed(tier::Index& index, std::span<const std::uint32_t> slots) override;
  // Copies into the arena the run of `keys` (from keys[0]) that L2 holds and
  // the arena does not. Returns how many of keys[0..] are now stored.
  boost::asio::awaitable<Promoted> promote(tier::Index& index, std::vector<kv::ChunkKey> keys,
                                           tier::TenantId tenant) override;
  // Queues none of `ns` to write, promotes none of it from now on, and
  // deletes its values from every master in the background (SCAN, UNLINK);
  // once every master was scanned to its end the namespace is promoted
  // again (what is stored anew). Returns 0: the count comes later, in
  // L2Stats::purged.
  std::size_t drop(const kv::Digest& ns) override;

  L2Stats stats() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvstrand::server
