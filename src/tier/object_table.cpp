#include "tier/object_table.hpp"
#include "tier/stored_field.hpp"

#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvstrand::tier {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'A', 'R', 'E', 'N', 'A'};
constexpr std::uint64_t kTableAlign = 4096;

// The entry's state word: the one field whose single store decides.
enum : std::uint64_t { kFree = 0, kReserved = 1, kCommitted = 2 };

// Entry fields (offsets in its 128 bytes). The checksum covers [16, 128).
constexpr std::size_t kStateAt = 0, kCheckAt = 8, kNsAt = 16, kHashAt = 48, kRankAt = 80, kFlagsAt = 84,
                      kBytesAt = 88, kTenantAt = 96, kCheckedFrom = 16;
// Slab header fields; the checksum covers [0, 56).
constexpr std::size_t kVersionAt = 8, kPerSlabAt = 12, kObjectAt = 16, kSlabAt = 24, kArenaAt = 32, kStrideAt = 40,
                      kHeaderCheckAt = 56;


// Other processes map the arena too, and a kill may land between any two
// stores: the state word is written whole, after (commit) or before
// (reserve) what it vouches for.
void store_state(std::byte* entry, std::uint64_t state) {
  __atomic_store_n(reinterpret_cast<std::uint64_t*>(entry + kStateAt), state, __ATOMIC_RELEASE);
}
std::uint64_t load_state(const std::byte* entry) {
  return __atomic_load_n(reinterpret_cast<const std::uint64_t*>(entry + kStateAt), __ATOMIC_ACQUIRE);
}

std::uint64_t entry_check(const std::byte* entry) { return XXH3_64bits(entry + kCheckedFrom, kEntryBytes - kCheckedFrom); }
std::uint64_t header_check(const std::byte* h) { return XXH3_64bits(h, kHeaderCheckAt); }

}  // namespace

SlabGeometry described_geometry(std::uint64_t slab_bytes, std::uint64_t object_bytes, std::uint64_t align) noexcept {
  if (object_bytes == 0 || align == 0) return {};
  const std::uint64_t stride = (object_bytes + align - 1) / align * align;
  auto table = [](std::uint64_t n) { return (kSlabHeaderBytes + n * kEntryBytes + kTableAlign - 1) / kTableAlign * kTableAlign; };
  std::uint64_t n = slab_bytes / (stride + kEntryBytes);
  while (n > 0 && table(n) + n * stride > slab_bytes) --n;
  return {static_cast<std::uint32_t>(n), n == 0 ? 0 : table(n), stride};
}

void ObjectTable::slab_assigned(std::uint32_t slab, std::uint64_t object_bytes) {
  const SlabGeometry g = described_geometry(slab_bytes_, object_bytes, align_);
  std::byte* h = slab_at(slab);
  std::memset(h, 0, g.first_object);  // no entry of an earlier life survives the new header
  std::memcpy(h, kMagic, sizeof kMagic);
  put_field<std::uint32_t>(h + kVersionAt, kObjectTableVersion);
  put_field<std::uint32_t>(h + kPerSlabAt, g.per_slab);
  put_field<std::uint64_t>(h + kObjectAt, object_bytes);
  put_field<std::uint64_t>(h + kSlabAt, slab_bytes_);
  put_field<std::uint64_t>(h + kArenaAt, arena_bytes_);
  put_field<std::uint64_t>(h + kStrideAt, g.stride);
  put_field<std::uint64_t>(h + kHeaderCheckAt, header_check(h));
}

void ObjectTable::reserved(std::uint32_t slab, std::uint32_t i, const kv::ChunkKey& key, bool has_image,
                           std::uint64_t tenant_tag) {
  std::byte* e = entry_at(slab, i);
  store_state(e, kReserved);  // first: the slot is no longer what it held
  std::memcpy(e + kNsAt, key.ns.data(), key.ns.size());
  std::memcpy(e + kHashAt, key.hash.data(), key.hash.size());
  put_field<std::uint32_t>(e + kRankAt, key.kv_rank);
  put_field<std::uint32_t>(e + kFlagsAt, has_image ? 1u : 0u);
  put_field<std::uint64_t>(e + kBytesAt, get_field<std::uint64_t>(slab_at(slab) + kObjectAt));
  std::memset(e + kBytesAt + 8, 0, kEntryBytes - kBytesAt - 8);
  put_field<std::uint64_t>(e + kTenantAt, tenant_tag);
  put_field<std::uint64_t>(e + kCheckAt, entry_check(e));
}

void ObjectTable::committed(std::uint32_t slab, std::uint32_t i) { store_state(entry_at(slab, i), kCommitted); }

void ObjectTable::freed(std::uint32_t slab, std::uint32_t i) { store_state(entry_at(slab, i), kFree); }

ObjectTable::Header ObjectTable::header(std::uint32_t s, std::string* unreadable) const {
  const std::byte* h = slab_at(s);
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) return {};  // never given to a class
  const auto version = get_field<std::uint32_t>(h + kVersionAt);
  if (version != kObjectTableVersion) {
    *unreadable = "its object tables are format version " + std::to_string(version) + " (this server reads " +
                  std::to_string(kObjectTableVersion) + ")";
    return {};
  }
  if (get_field<std::uint64_t>(h + kSlabAt) != slab_bytes_ || get_field<std::uint64_t>(h + kArenaAt) != arena_bytes_) {
    *unreadable = "it was written for slabs of " + std::to_string(get_field<std::uint64_t>(h + kSlabAt)) + " B in " +
                  std::to_string(get_field<std::uint64_t>(h + kArenaAt)) + " B";
    return {};
  }
  const auto object_bytes = get_field<std::uint64_t>(h + kObjectAt);
  const SlabGeometry g = described_geometry(slab_bytes_, object_bytes, align_);
  const auto stride = get_field<std::uint64_t>(h + kStrideAt);
  if (get_field<std::uint64_t>(h + kHeaderCheckAt) == header_check(h) && (stride == 0 ? object_bytes : stride) != g.stride) {
    // Slots laid out for another alignment (--disk given or left out
    // since): every object would be read at the wrong place.
    *unreadable = "its objects are " + std::to_string(stride == 0 ? object_bytes : stride) +
                  " B apart and this server lays them " + std::to_string(g.stride) + " B apart (--disk)";
    return {};
  }
  if (get_field<std::uint64_t>(h + kHeaderCheckAt) != header_check(h) || g.per_slab == 0 ||
      get_field<std::uint32_t>(h + kPerSlabAt) != g.per_slab)
    return {true, 0, 0};  // the slab goes back unassigned; nothing of it is trusted
  return {true, object_bytes, g.per_slab};
}

ObjectTable::Census ObjectTable::census() const {
  Census c;
  const auto slabs = static_cast<std::uint32_t>(arena_bytes_ / slab_bytes_);
  for (std::uint32_t s = 0; s < slabs && c.unreadable.empty(); ++s)
    if (const Header h = header(s, &c.unreadable); h.object_bytes != 0) c.slots_by_object_size[h.object_bytes] += h.per_slab;
  return c;
}

ObjectTable::Recovery ObjectTable::scan() {
  std::vector<Slab> slabs;
  Recovery r = scan([&](const Slab& slab) { slabs.push_back(slab); });
  r.slabs = std::move(slabs);
  return r;
}

ObjectTable::Recovery ObjectTable::scan(const std::function<void(const Slab&)>& each) {
  Recovery r;
  Slab slab;  // one slab's slots at a time, the buffer reused
  const auto slabs = static_cast<std::uint32_t>(arena_bytes_ / slab_bytes_);
  for (std::uint32_t s = 0; s < slabs; ++s) {
    const Header h = header(s, &r.unreadable);
    if (!r.unreadable.empty()) return r;
    if (!h.claimed) continue;
    if (h.object_bytes == 0) {
      ++r.dropped_corrupt;
      continue;
    }
    slab.slab = s;
    slab.object_bytes = h.object_bytes;
    slab.slots.assign(h.per_slab, std::nullopt);
    for (std::uint32_t i = 0; i < h.per_slab; ++i) {
      std::byte* e = entry_at(s, i);
      const std::uint64_t state = load_state(e);
      if (state == kFree) continue;
      if (state == kCommitted && get_field<std::uint64_t>(e + kCheckAt) == entry_check(e) &&
          get_field<std::uint64_t>(e + kBytesAt) == h.object_bytes) {
        Index::Restored o;
        std::memcpy(o.key.ns.data(), e + kNsAt, o.key.ns.size());
        std::memcpy(o.key.hash.data(), e + kHashAt, o.key.hash.size());
        o.key.kv_rank = get_field<std::uint32_t>(e + kRankAt);
        o.has_image = (get_field<std::uint32_t>(e + kFlagsAt) & 1u) != 0;
        o.tenant_tag = get_field<std::uint64_t>(e + kTenantAt);
        slab.slots[i] = o;
        ++r.objects;
        continue;
      }
      ++(state == kReserved ? r.dropped_uncommitted : r.dropped_corrupt);
      store_state(e, kFree);
    }
    each(slab);
  }
  return r;
}

}  // namespace kvstrand::tier
