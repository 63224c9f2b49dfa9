#include "server/levels/disk_recovery.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>

#include "tier/object_header.hpp"

namespace kvstrand::server {

DiskRecovery recover_disk(DiskRing& ring, const std::vector<DiskFile>& files, std::uint64_t extent_bytes,
                          std::uint32_t total_extents, tier::SizeClasses& disk) {
  DiskRecovery out;
  const auto t0 = std::chrono::steady_clock::now();
  constexpr std::size_t kBatch = 256;
  Aligned buf = aligned(kBatch * kDiskBlock);
  std::vector<DiskRing::SyncRead> batch;
  // Reads blocks at `offsets` (disk offsets), kBatch at a time; calls
  // each(i, block or null when the read failed).
  auto read_blocks = [&](const std::vector<std::uint64_t>& offsets, auto&& each) {
    for (std::size_t at = 0; at < offsets.size(); at += kBatch) {
      const std::size_t n = std::min(kBatch, offsets.size() - at);
      batch.clear();
      for (std::size_t i = 0; i < n; ++i) {
        auto [fd, off] = disk_place(files, extent_bytes, offsets[at + i]);
        batch.push_back({fd, buf.get() + i * kDiskBlock, kDiskBlock, off});
      }
      ring.read_now(batch);
      for (std::size_t i = 0; i < n; ++i)
        each(at + i, batch[i].result == static_cast<int>(kDiskBlock) ? buf.get() + i * kDiskBlock : nullptr);
    }
  };
  std::vector<std::uint64_t> heads;
  for (std::uint32_t e = 0; e < total_extents; ++e) heads.push_back(std::uint64_t{e} * extent_bytes);
  std::vector<std::uint64_t> object_of(total_extents, 0);  // 0: not a known extent
  read_blocks(heads, [&](std::size_t e, const std::byte* h) {
    if (h == nullptr || std::memcmp(h, kExtentMagic, sizeof kExtentMagic) != 0) return;
    const auto x = read_extent_header(h);
    if (!x || x->files != files.size() || x->extent_bytes != extent_bytes || x->extent != e || x->object_bytes == 0 ||
        x->stride != disk.stride(x->object_bytes) || disk.index(x->object_bytes) == nullptr) {
      ++out.dropped;
      return;
    }
    object_of[e] = x->object_bytes;
  });
  // Each class's index sized for all its extents at once, as a named
  // arena's restart does (server/arena_recovery.cpp): adopted extent by
  // extent, it would grow once an extent.
  std::map<std::uint64_t, std::uint64_t> slots_of;
  for (const std::uint64_t object_bytes : object_of)
    if (object_bytes != 0) slots_of[object_bytes] += disk.geometry(object_bytes).per_slab;
  for (const auto& [object_bytes, slots] : slots_of)
    if (tier::Index* idx = disk.index(object_bytes)) idx->reserve_slots(slots);
  for (std::uint32_t e = 0; e < total_extents; ++e) {
    const std::uint64_t object_bytes = object_of[e];
    if (object_bytes == 0) continue;
    // Each slot's header block: the slot's start (the object follows it).
    const tier::SlabGeometry g = disk.geometry(object_bytes);
    std::vector<std::uint64_t> slots;
    for (std::uint64_t k = 0; k < g.per_slab; ++k)
      slots.push_back(std::uint64_t{e} * extent_bytes + g.first_object + k * g.stride);
    std::vector<std::optional<tier::Index::Restored>> restored(g.per_slab);
    read_blocks(slots, [&](std::size_t k, const std::byte* h) {
      if (h == nullptr || std::memcmp(h, "KVSTRL2", 7) != 0) return;  // never written
      auto header = tier::read_object_header({h, tier::kObjectHeaderBytes});
      if (!header || header->has_mac || header->object_bytes != object_bytes) {
        ++out.dropped;
        return;
      }
      restored[k] = tier::Index::Restored{header->key, header->has_image, header->tenant_tag};
      if (std::string d = read_description(h); !d.empty()) out.descriptions[header->key] = std::move(d);
    });
    std::size_t duplicates = 0;
    if (disk.adopt_slab(e, object_bytes, restored, &duplicates) == nullptr) continue;
    for (const auto& r : restored) out.objects += r ? 1 : 0;
    out.objects -= duplicates;
    out.dropped += duplicates;
  }
  for (std::uint32_t e = 0; e < total_extents; ++e) disk.add_slab(e);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace kvstrand::server
