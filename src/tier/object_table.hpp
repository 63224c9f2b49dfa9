// What a persistent arena (kvstrand-server --arena-path) keeps about its own
// objects, inside the arena, so that the next server finds them again
// without reading a payload. Each slab a size class takes describes itself:
//
//   [slab header, 64 B][one 128 B entry per object slot][to 4 KiB][objects]
//
// - The slab header: magic, format version, the arena's geometry, the
//   class's object size and slot stride (0 in slabs written before slots
//   could be aligned: the object size), with a checksum.
// - An entry: its state word (free, reserved, committed), then the object's
//   key, image flag, size and tenant tag (TenantBook::tag_of; in bytes an
//   earlier server left zero, so its entries read as the unnamed tenant's),
//   with a checksum over them.
// - Crash order (a SIGKILL can stop the server between any two stores): a
//   reserve writes the state word "reserved" before anything else and
//   before the slot's offset is sent to a writer; a commit, sent only once
//   the writer's copy ended, writes "committed" with one aligned 8-byte
//   store. So a committed entry always names the bytes its slot holds, and
//   every reservation the old server never committed (a half-written
//   object) reads back as one to drop. The checksum catches a corrupted
//   entry; it drops that object only.
// - A slab given to a class has its entries cleared before its header is
//   written: stale entries of an earlier life never come back.
//
// On the server's strand (writes); scan() before serving.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <kvstrand/chunk_keys.hpp>
#include "tier/index.hpp"

namespace kvstrand::tier {

constexpr std::uint32_t kObjectTableVersion = 1;
constexpr std::uint64_t kSlabHeaderBytes = 64;
constexpr std::uint64_t kEntryBytes = 128;

// Where a described slab keeps its objects: per_slab of them, the first at
// first_object (the table before it, rounded up to 4 KiB), one every
// `stride` bytes (the object size rounded up to `align`: 4 KiB where a disk
// tier reads and writes objects in place with O_DIRECT). per_slab 0: an
// object does not fit with its entry.
struct SlabGeometry {
  std::uint32_t per_slab = 0;
  std::uint64_t first_object = 0;
  std::uint64_t stride = 0;
};
SlabGeometry described_geometry(std::uint64_t slab_bytes, std::uint64_t object_bytes, std::uint64_t align = 1) noexcept;

class ObjectTable {
 public:
  // `base`: the arena, mapped read-write, of `arena_bytes` in slabs of
  // `slab_bytes`, its object slots aligned to `align` (described_geometry).
  ObjectTable(std::byte* base, std::uint64_t arena_bytes, std::uint64_t slab_bytes, std::uint64_t align = 1) noexcept
      : base_(base), arena_bytes_(arena_bytes), slab_bytes_(slab_bytes), align_(align) {}
  std::uint64_t align() const noexcept { return align_; }

  // A class of `object_bytes` took `slab`: its entries cleared, then its header.
  void slab_assigned(std::uint32_t slab, std::uint64_t object_bytes);
  void reserved(std::uint32_t slab, std::uint32_t i, const kv::ChunkKey& key, bool has_image,
                std::uint64_t tenant_tag = 0);
  void committed(std::uint32_t slab, std::uint32_t i);
  void freed(std::uint32_t slab, std::uint32_t i);

  // What the arena holds, read from its tables.
  struct Slab {
    std::uint32_t slab = 0;
    std::uint64_t object_bytes = 0;
    std::vector<std::optional<Index::Restored>> slots;  // per_slab of them
  };
  struct Recovery {
    std::vector<Slab> slabs;  // slabs a class had taken, in order
    std::uint64_t objects = 0;              // committed entries found whole
    std::uint64_t dropped_uncommitted = 0;  // reservations never committed
    // Entries whose checksum fails, and slabs whose header fails (one
    // each: a failed header's slot count is not trusted, so its objects
    // are not counted one by one).
    std::uint64_t dropped_corrupt = 0;
    // Non-empty: the arena is of another format or geometry and cannot be
    // read (the caller starts empty, saying this).
    std::string unreadable;
  };
  // Reads every slab's table. Entries it drops are marked free on the way.
  Recovery scan();
  // The same, a slab at a time: `each` is told each slab a class had, its
  // slots in a buffer reused for the next (a restart of 10M objects then
  // holds one slab's, not a gigabyte of them, the memory first touched
  // page by page); the Recovery has no `slabs`. Stops at an unreadable
  // slab, as scan() does, having told `each` of the slabs before it.
  Recovery scan(const std::function<void(const Slab&)>& each);
  // The slabs' headers alone, before a scan: the slots by object size of
  // the slabs a class had (what each class's index holds after the scan,
  // to size it once first), or why the arena cannot be read (what scan()
  // would stop at), before anything of it is used.
  struct Census {
    std::map<std::uint64_t, std::uint64_t> slots_by_object_size;
    std::string unreadable;
  };
  Census census() const;

 private:
  // A slab's header: not claimed (never given to a class, or unreadable:
  // *unreadable says why), claimed but not trusted (object_bytes 0), or
  // its class's object size and slots.
  struct Header {
    bool claimed = false;
    std::uint64_t object_bytes = 0;
    std::uint32_t per_slab = 0;
  };
  Header header(std::uint32_t slab, std::string* unreadable) const;
  std::byte* slab_at(std::uint32_t slab) const noexcept { return base_ + static_cast<std::uint64_t>(slab) * slab_bytes_; }
  std::byte* entry_at(std::uint32_t slab, std::uint32_t i) const noexcept {
    return slab_at(slab) + kSlabHeaderBytes + static_cast<std::uint64_t>(i) * kEntryBytes;
  }

  std::byte* base_;
  std::uint64_t arena_bytes_;
  std::uint64_t slab_bytes_;
  std::uint64_t align_;
};

}  // namespace kvstrand::tier
