// The disk tier's restart: every extent's header block read (an extent of
// another geometry, file count or object size is dropped, never misread),
// then each known extent's slot headers, whose objects the disk's index
// adopts (a torn or foreign header drops its slot; a key found twice keeps
// one). Synchronous reads through the ring, before the server serves.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/levels/disk_file.hpp"
#include "server/levels/disk_ring.hpp"
#include "tier/size_classes.hpp"

namespace kvstrand::server {

struct DiskRecovery {
  std::uint64_t objects = 0;  // adopted into the disk's index
  std::uint64_t dropped = 0;  // headers found torn, of another geometry, or duplicates
  double seconds = 0;
  // The KV-event descriptions their headers kept, by key (--events).
  std::unordered_map<kv::ChunkKey, std::string, tier::ChunkKeyHash> descriptions;
};

// Adopts what `total_extents` extents over `files` hold into `disk`, then
// gives every extent to it (add_slab): known ones keep their objects.
DiskRecovery recover_disk(DiskRing& ring, const std::vector<DiskFile>& files, std::uint64_t extent_bytes,
                          std::uint32_t total_extents, tier::SizeClasses& disk);

}  // namespace kvstrand::server
