// The node server's third level: files on local disks (NVMe) under the
// arena. Objects are written behind to them as they are committed; a lookup
// that misses the arena reads the run it finds there back into the arena
// before it is answered. Order: arena -> disk -> L2.
//
// - Layout: the disk space is cut in extents, each given to one object size
//   (as the arena's slabs are, tier::SizeClasses), striped over the files
//   (--disk several times: extent e is in file e % files). An extent starts
//   with a 4 KiB extent header (its object size and geometry); each slot is
//   a 4 KiB block holding the object's header (tier/object_header.hpp: key,
//   image flag, size, XXH3 of the object, XXH3 of the header), then the
//   object, padded to 4 KiB. Reads and writes are O_DIRECT between the file
//   and the arena's own slot (the arena's slots are 4 KiB-aligned when a
//   disk is given): the server copies no payload.
// - Write-behind never delays a reply: a commit queues its objects, each
//   read-locked in the arena until its write ended; what does not fit the queue
//   (--disk-queue objects, an eighth of the arena's bytes) is dropped and
//   counted. An object already on disk is
//   not written again. Writing at commit, not at eviction, is what lets an
//   eviction never wait: the arena's victim is on disk already.
// - Promotion: only the asking session waits, at most --disk-timeout; the
//   reads still running then go on and commit into the arena for the next
//   lookup. An object is committed into the arena only if its header names
//   exactly the chunk asked for and its bytes match the checksum; else it is
//   a miss, counted, and dropped from the disk.
// - Recovery: a restarted server reads every extent header, then every
//   slot header of the extents it knows (no payload), and starts with
//   those objects; a payload is checked when it is read.
// - Capacity: CLOCK over the disk's slots (tier::Index), as in the arena.
//
// Everything runs on the server's strand (the ring's completions too).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <kvstrand/chunk_keys.hpp>
#include "common/strand.hpp"
#include "server/levels/lower_level.hpp"
#include "tier/index.hpp"
#include "server/levels/disk_file.hpp"
#include "tier/size_classes.hpp"

namespace kvstrand::server {

class TierEvents;

struct DiskOptions {
  std::vector<std::string> paths;  // a file each, made if absent (a directory: its kvstrand.disk)
  std::uint64_t bytes = 0;         // over all paths
  std::chrono::milliseconds timeout{500};
  std::size_t max_queued = 1024;   // objects waiting to be written behind (each read-locked in the arena)
  // ... and their bytes: a slow disk must not lock so much of the arena that
  // saves are refused as full (the server sets an eighth of the arena).
  std::uint64_t max_queued_bytes = UINT64_MAX;
  unsigned depth = 32;             // objects read or written at once
};

struct DiskStats {
  std::uint64_t capacity_bytes = 0;  // what the extents hold for objects
  std::uint64_t used_bytes = 0;
  std::size_t objects = 0;
  std::size_t files = 0;
  bool registered_buffers = false;
  std::uint64_t written = 0;          // objects written behind
  std::uint64_t written_bytes = 0;
  std::uint64_t write_dropped = 0;    // the queue was full
  std::uint64_t write_errors = 0;     // a write failed (EIO, ENOSPC, ...)
  std::uint64_t promoted = 0;         // objects read back into the arena
  std::uint64_t read_bytes = 0;
  std::uint64_t read_errors = 0;
  std::uint64_t checksum_failures = 0;  // a header or payload that did not match: a miss, dropped
  std::uint64_t lookups = 0;          // lookups that asked the disk
  std::uint64_t lookup_misses = 0;    // ... and found nothing after the arena's hit
  std::uint64_t timeouts = 0;         // promotions answered at --disk-timeout with reads still running
  std::uint64_t evictions = 0;
  std::uint64_t recovered_objects = 0;
  std::uint64_t recovery_dropped = 0;  // slot headers found torn or of another object size
  double recovery_seconds = 0;
  std::size_t queue = 0;              // objects waiting to be written
  std::size_t in_flight = 0;          // objects being read or written
  std::size_t pinned = 0;             // disk objects a promotion holds (0 once its reads ended or were dropped)
};

class DiskTier final : public LowerLevel {
 public:
  // Opens (makes, preallocates) the files and reads back what they hold;
  // before the server serves. Throws std::runtime_error naming the flag at
  // fault (--disk, --disk-bytes). `arena`: the server's mapping of the
  // arena, slots 4 KiB-aligned.
  DiskTier(common::Strand strand, DiskOptions options, std::byte* arena, std::uint64_t arena_slab_bytes,
           std::uint32_t arena_slabs, tier::SizeClasses& classes);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  const char* name() const noexcept override { return "disk"; }
  // On the strand: completions start being delivered.
  void start() override;
  // Arena slab `slab` is populated: its memory becomes a registered buffer.
  void slab_ready(std::uint32_t slab);
  // A reservation's objects (`slots` of `index`) were just committed.
  void committed(tier::Index& index, std::span<const std::uint32_t> slots) override;
  // Reads into the arena the run of `keys` (from keys[0]) that the disk
  // holds; waits at most the timeout. Returns how many of keys[0..] are in
  // the arena now, in a row.
  boost::asio::awaitable<Promoted> promote(tier::Index& index, std::vector<kv::ChunkKey> keys,
                                           tier::TenantId tenant) override;
  // Frees the disk's objects of `ns` (those being read when their reads
  // end, those being written at their commit), clears their slot headers
  // so that a restarted server does not find them, and forgets those
  // queued to be written.
  std::size_t drop(const kv::Digest& ns) override;
  // Waits until the write queue is empty and nothing is in flight, at most
  // `bound`; returns how many objects were still queued or in flight.
  boost::asio::awaitable<std::size_t> drain(std::chrono::milliseconds bound) override;
  // Stops: nothing more is queued; waits (at most `bound`) for what is in
  // flight, then no completion is delivered. On the strand.
  boost::asio::awaitable<void> close(std::chrono::milliseconds bound) override;

  DiskStats stats() const;
  // With --events: the disk's objects are announced on the disk's medium
  // (EventOptions::disk_medium: "STORAGE", or "DISK" for SGLang's), and
  // each keeps its description in its header block.
  void set_events(TierEvents* events);
  // Tenants' shares of the disk: each tenant's quota of the arena
  // (`arena`, of `arena_bytes`), in proportion to the disk's size.
  void set_tenants(const tier::TenantBook& arena, std::uint64_t arena_bytes);
  const tier::TenantBook* tenants() const;  // null before set_tenants
  void tenant_namespaces(const std::string& name, std::set<kv::Digest>& out) const override;
  // The descriptions its start found, by key (once).
  std::unordered_map<kv::ChunkKey, std::string, tier::ChunkKeyHash> take_recovered_descriptions();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvstrand::server
