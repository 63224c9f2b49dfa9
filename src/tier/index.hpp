// The index of a host tier: fixed-size object slots keyed by ChunkKey, LRU
// eviction of objects no one holds, and holds (leases and reservations) that
// name what an in-flight copy may touch.
//
// One implementation for both tiers: LocalIndex keeps it on the engine's
// strand, kvstrand-server on its own. Pure: no I/O and no memory of its
// own; slots are numbers the Arena turns into places. Rules:
// - A key already stored (or being written) is not rewritten.
// - A reserved object is invisible until committed; an aborted one is freed,
//   so a reader sees a whole object or a miss, never a half-written one.
// - Eviction takes only committed objects that no hold pins, the least
//   recently used first as CLOCK approximates it (a lookup marks an object
//   used; the hand gives a marked object a second chance), so a lookup costs
//   no list surgery and the cost stays flat from 10k to 1M objects
//   (bench_index). If nothing can go the key is refused (`full`). An object
//   a lease or a reservation names is never evicted, moved or reused.
// - A hold ends only by commit, release, or its owner's end (release_owner:
//   the server calls it when the owner's process has exited). Never by a
//   clock: a stopped process keeps what it holds.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/hit_plan.hpp>
#include "tier/tenant_book.hpp"

namespace kvstrand::tier {

// Chunk hashes are SHA-256 output, so any 8 of their bytes are already a
// good hash; the namespace and rank are mixed in for keys of other models.
struct ChunkKeyHash {
  std::size_t operator()(const kv::ChunkKey& k) const noexcept {
    std::uint64_t h = 0, n = 0;
    std::memcpy(&h, k.hash.data(), sizeof h);
    std::memcpy(&n, k.ns.data(), sizeof n);
    return static_cast<std::size_t>(h ^ (n * 0x9e3779b97f4a7c15ull) ^ k.kv_rank);
  }
};

// Who holds a lease or a reservation: the server's id for a client process
// (0 for the embedded tier's own engine).
using Owner = std::uint64_t;
// A lease or a reservation, by id; 0 is "none".
using HoldId = std::uint64_t;

class Index {
 public:
  struct Stats {
    std::uint64_t capacity_bytes = 0;  // slots ready, in bytes
    std::uint64_t used_bytes = 0;
    std::size_t objects = 0;   // committed
    std::size_t writing = 0;   // reserved, not yet committed
    std::size_t pinned = 0;    // committed objects a lease or a load holds
    std::size_t leases = 0;
    std::size_t reservations = 0;
    std::uint64_t evictions = 0;
    std::uint64_t refused_full = 0;
    std::uint64_t lookup_hits = 0;    // chunks found by lookups
    std::uint64_t lookup_misses = 0;  // lookups that stopped short of their keys
    std::uint64_t lookup_asked = 0;   // chunks lookups asked for
    std::uint64_t committed = 0;      // objects committed, in all (saves and promotions)
    std::uint64_t dropped = 0;        // objects drop_namespace dropped
  };

  // Told of every change to a slot's object, in the order it happens: a
  // persistent arena keeps its object table with it (ObjectTable). reserved
  // comes before the slot is handed to a writer, committed after the copy
  // into it ended, freed when the object goes (aborted or evicted).
  struct Listener {
    virtual ~Listener() = default;
    virtual void reserved(std::uint32_t slot, const kv::ChunkKey& key, bool has_image) = 0;
    virtual void committed(std::uint32_t slot) = 0;
    virtual void freed(std::uint32_t slot) = 0;
  };
  // A committed object found again (a restarted server's object table).
  struct Restored {
    kv::ChunkKey key;
    bool has_image = false;
    std::uint64_t tenant_tag = 0;  // TenantBook::tag_of its tenant's name (0: the unnamed one, or not kept)
  };

  explicit Index(std::uint64_t object_bytes) : object_bytes_(object_bytes) {}
  // A fixed number of slots from the start (the embedded tier's arena).
  Index(std::uint64_t capacity_bytes, std::uint64_t object_bytes);

  // Makes `count` more slots usable, numbered after the existing ones (a
  // slab of the arena became ready). All or nothing: when memory runs out
  // (std::bad_alloc) the index is as it was.
  void add_slots(std::uint32_t count);
  // Room for `count` more slots' entries at once, before slabs are added
  // one by one (a restart adopting thousands): added one at a time, each
  // slab would copy every entry before it.
  void reserve_slots(std::uint64_t count) { objects_.reserve(static_cast<std::size_t>(slots_) + count); }
  // The most slots this index will ever have (its class given every slab
  // of its pool): add_slots grows its room ahead by a quarter, never past
  // this. Unset: no bound on that room.
  void limit_slots(std::uint64_t most) noexcept { slot_limit_ = most; }
  // Slots the index has room for without growing (>= slots()).
  std::size_t slot_room() const noexcept { return objects_.capacity(); }
  // What one slot costs the index in memory at most: its object entry, its
  // free-list entry, and its two key-table entries (the table's load is at
  // most a half). The server bounds a size class's index by it
  // (--max-index-bytes).
  static std::uint64_t bytes_per_slot() noexcept;
  // The same, for slots some of which hold committed objects already:
  // restored[i] is slot slots() + i's. Returns how many it dropped as
  // duplicates of a key already present (a corrupted table).
  std::size_t add_restored_slots(std::span<const std::optional<Restored>> restored);
  void set_listener(Listener* listener) noexcept { listener_ = listener; }
  // A second listener, told after the first: the server's KV events. A
  // slot's freed may come twice (a dropped object held: at the drop, and at
  // its release).
  void set_observer(Listener* observer) noexcept { observer_ = observer; }
  // Tenants' bytes and quotas (kvstrand-server), shared by the indexes of
  // one tier; the objects held already are charged to theirs (a restarted
  // server's: to none). None: no tenant is counted.
  void set_tenants(TenantBook* book);
  TenantId tenant_at(std::uint32_t slot) const { return objects_.at(slot).tenant; }
  // The namespaces of `tenant`'s objects here (a drop of the tenant).
  void namespaces_of(TenantId tenant, std::set<kv::Digest>& out) const;
  std::uint32_t slots() const noexcept { return slots_; }
  // Hold ids from `first` on (before any hold): several indexes over one
  // arena give each its own range, so that a hold id names its index.
  // Hold ids from now on: `prefix` (the size class, in the top 16 bits) and
  // 48 random bits, unique among the live holds. A hold id is what a
  // client names a hold by, and what a scheduler hands a worker (adopt):
  // one client must not be able to guess another's (counted ids were
  // released by guessing an own id + 1). Without this: 1, 2, 3, ...
  void issue_random_holds(HoldId prefix) noexcept {
    hold_prefix_ = prefix;
    random_holds_ = true;
  }
  // Slots holding no object (a reserve takes these before evicting).
  std::size_t free_slots() const noexcept { return free_.size(); }
  // Committed objects no hold pins: what eviction can free now.
  std::size_t evictable() const noexcept { return evictable_; }
  std::uint64_t object_bytes() const noexcept { return object_bytes_; }

  // ---- objects ----------------------------------------------------------------
  enum class Reserve { reserved, exists, full };
  // `tenant`: whose object it is (TenantBook; 0 without one).
  Reserve reserve(const kv::ChunkKey& key, bool has_image, std::uint32_t* slot, TenantId tenant = 0);
  void commit(const kv::ChunkKey& key);
  void abort(const kv::ChunkKey& key);
  // Frees a committed object that no hold pins (its bytes were found bad).
  // False when it is absent, being written or held.
  bool erase(const kv::ChunkKey& key);
  // Drops every object of namespace `ns` (an online weight update): no
  // lookup finds one from now on. Those no hold pins are freed now; one
  // being read stays readable to its holder and is freed when the last one
  // lets go; one being written is freed at its commit. Its key stays taken
  // until then (a save of it meanwhile is told it exists). Returns how
  // many objects it dropped; `each`, when given, is told every one's slot.
  std::size_t drop_namespace(const kv::Digest& ns, const std::function<void(std::uint32_t slot)>& each = {});

  // The longest run of committed objects from keys[0], and the boundaries
  // (in tokens) whose image is stored within it.
  kv::HitSource lookup(std::span<const kv::ChunkKey> keys, std::uint32_t chunk_tokens);

  // All keys committed: read-locks them (no eviction, no erase, until the
  // matching read_unlock) and returns their slots. Otherwise locks nothing.
  // Each read_lock needs its own read_unlock. ("Pin" is kept for page-locking
  // host memory, src/device's HostRegistration.)
  std::optional<std::vector<std::uint32_t>> read_lock(std::span<const kv::ChunkKey> keys);
  void read_unlock(std::span<const kv::ChunkKey> keys);
  // One key: read-locked if committed (true).
  bool read_lock(const kv::ChunkKey& key) { return read_lock(std::span(&key, 1)).has_value(); }
  void read_unlock(const kv::ChunkKey& key) { read_unlock(std::span(&key, 1)); }
  bool has_image(const kv::ChunkKey& key) const;
  // How many of keys[0..] are stored and committed, in a row. No side
  // effects: not a use, not counted as a lookup.
  std::size_t present_run(std::span<const kv::ChunkKey> keys) const;
  bool present(const kv::ChunkKey& key) const { return present_run(std::span(&key, 1)) == 1; }
  // How many of `keys` are not in the index at all (neither committed nor
  // being written): what a reservation of them would take objects for.
  std::size_t absent(std::span<const kv::ChunkKey> keys) const;
  // The key and image flag of a used slot (a hold names it).
  const kv::ChunkKey& key_at(std::uint32_t slot) const { return objects_.at(slot).key; }
  bool image_at(std::uint32_t slot) const { return objects_.at(slot).has_image; }
  // Whether a lookup can find the slot's object (committed, not dropped).
  bool readable_at(std::uint32_t slot) const {
    const Object& o = objects_.at(slot);
    return o.used && o.committed && !o.dropped;
  }

  // ---- holds --------------------------------------------------------------------
  struct Lease {
    HoldId id = 0;  // 0: the hit is empty and nothing is held
    kv::HitSource hit;
    std::vector<std::uint32_t> slots;  // one per chunk of the hit, in key order
  };
  // A lookup whose hit stays pinned until release(id).
  Lease lease(std::span<const kv::ChunkKey> keys, std::uint32_t chunk_tokens, Owner owner);

  enum class Chunk : std::uint8_t { reserved = 0, existed = 1, full = 2 };
  struct Reservation {
    HoldId id = 0;  // 0: nothing was reserved
    std::vector<Chunk> chunks;
    std::vector<std::uint32_t> slots;  // per key; meaningful where reserved
    std::uint32_t reserved = 0, existed = 0, full = 0;
  };
  // Reserves every key not stored yet (images[i]: chunk i carries an image).
  Reservation reserve(std::span<const kv::ChunkKey> keys, std::span<const bool> images, Owner owner,
                      TenantId tenant = 0);
  // Ends a reservation: commits its objects (ok) or frees them. False for an
  // id that is not a live reservation.
  bool commit(HoldId id, bool ok);
  // Ends a lease (unpins) or a reservation (frees what it did not commit).
  // False for an unknown id.
  bool release(HoldId id);
  // Whether `id` is a live lease (not a reservation) never adopted: a
  // lease changes owner at most once, so a second adopter of the same
  // handoff gets a miss, never another process's lease.
  bool adoptable(HoldId id) const;
  // Hands an adoptable lease to `owner` (another process), once.
  void adopt(HoldId id, Owner owner);
  // The slots a live hold names (empty for an unknown id).
  std::vector<std::uint32_t> hold_slots(HoldId id) const;
  // The owner of a live hold (0 for an unknown id).
  Owner owner_of(HoldId id) const;
  // Ends every hold of `owner`; returns how many.
  std::size_t release_owner(Owner owner);

  struct Held {
    std::size_t leases = 0, reservations = 0;
    std::uint64_t leased_bytes = 0, reserved_bytes = 0;
  };
  Held held_by(Owner owner) const;
  // Every live hold's owner (the debug views).
  std::map<HoldId, std::pair<Owner, bool /*lease*/>> holds() const;

  Stats stats() const;
  // The counters and bytes alone, without counting objects: O(1).
  Stats counters() const;

  // ---- why a key is absent (the server's lookup misses, by reason) ---------
  // Whether `key` was among the last kRememberedEvictions objects evicted.
  bool evicted_recently(const kv::ChunkKey& key) const;
  // Whether any object of namespace `ns` is stored or being written.
  bool holds_namespace(const kv::Digest& ns) const { return per_namespace_.contains(ns); }
  // Objects stored or being written, by namespace.
  const std::map<kv::Digest, std::size_t>& namespaces() const noexcept { return per_namespace_; }
  static constexpr std::size_t kRememberedEvictions = 1 << 16;

 private:
  static constexpr std::uint32_t kNone = UINT32_MAX;
  // One slot: its object when `used`. Slots are the clock's ring.
  struct Object {
    kv::ChunkKey key;
    std::uint32_t readers = 0;
    std::uint32_t hash = 0;
    bool used = false;
    bool has_image = false;
    bool committed = false;
    bool referenced = false;  // used since the clock hand last passed
    bool dropped = false;     // drop_namespace came while it was held or being written
    TenantId tenant = 0;
  };
  struct Hold {
    Owner owner = 0;
    bool lease = false;
    std::vector<std::uint32_t> slots;  // pinned (lease) or reserved by it; held slots never change keys
    bool adopted = false;  // a lease handed to another owner (adopt)
  };
  static std::uint32_t hash_of(const kv::ChunkKey& k) noexcept {
    return static_cast<std::uint32_t>(ChunkKeyHash{}(k) >> 16);
  }
  // The key table: open addressing, linear probing, load <= 1/2. An entry
  // is (hash << 32) | (slot + 1); 0 is empty.
  std::uint32_t find(const kv::ChunkKey& key, std::uint32_t hash) const noexcept;  // kNone if absent
  // The same answer, looked for first in the slot after `before` (the slot
  // of the key before it in a prefix, or kNone): a prefix's chunks saved
  // together sit in consecutive slots, and an object compared there touches
  // no table entry (at 10M objects each one a cache miss).
  std::uint32_t find_after(const kv::ChunkKey& key, std::uint32_t hash, std::uint32_t before) const noexcept;
  // Whether `slot` holds an object whose key hashes to `hash`: a guess
  // whether a key is there, for what to fetch ahead.
  bool may_hold(std::uint64_t slot, std::uint32_t hash) const noexcept {
    return slot < slots_ && objects_[slot].used && objects_[slot].hash == hash;
  }
  void table_insert(std::uint32_t hash, std::uint32_t slot);
  void table_erase(std::uint32_t hash, std::uint32_t slot);
  void rebuild_table(std::vector<std::uint64_t> empty);  // `empty`: the new table, all zero
  void prefetch(std::uint32_t hash) const noexcept;
  void prefetch_object(std::uint32_t hash) const noexcept;

  bool evict_one(TenantId tenant);
  // One CLOCK turn (two at most) over the objects `may` allows.
  template <class May>
  bool evict_matching(May may);
  void evict_slot(std::uint32_t s);
  void free_slot(std::uint32_t slot);
  void add_reader(Object& o);
  void drop_reader(Object& o);
  void commit_slot(std::uint32_t slot);
  void abort_slot(std::uint32_t slot);
  // The run of committed objects from keys[0]; with `locked`, each object of
  // the run is read-locked and its slot appended.
  kv::HitSource run(std::span<const kv::ChunkKey> keys, std::uint32_t chunk_tokens,
                    std::vector<std::uint32_t>* locked);

  std::uint64_t object_bytes_;
  Listener* listener_ = nullptr;
  Listener* observer_ = nullptr;
  TenantBook* tenants_ = nullptr;
  std::uint32_t slots_ = 0;
  std::uint64_t slot_limit_ = UINT64_MAX;  // limit_slots
  std::vector<std::uint32_t> free_;
  std::vector<Object> objects_;       // by slot
  std::vector<std::uint64_t> table_;  // key -> slot
  std::uint64_t mask_ = 0;
  std::size_t stored_ = 0;            // used slots
  std::uint32_t hand_ = 0;
  std::size_t evictable_ = 0;  // committed objects no one reads
  std::map<HoldId, Hold> holds_;
  HoldId next_hold_ = 1;
  HoldId hold_prefix_ = 0;
  bool random_holds_ = false;
  std::vector<std::uint64_t> random_;  // getrandom's bytes not used yet (new_hold)
  HoldId new_hold();
  Stats stats_{};
  // Fingerprints (ChunkKeyHash) of the last evictions, oldest first, and
  // how often each is among them.
  std::deque<std::uint64_t> evicted_order_;
  std::unordered_map<std::uint64_t, std::uint32_t> evicted_;
  std::map<kv::Digest, std::size_t> per_namespace_;  // used slots, by namespace
  // Restored objects' tenant tags, by slot, until a TenantBook is set
  // (set_tenants resolves them, TenantBook::id_of_tag; then this is empty).
  std::vector<std::uint64_t> restored_tags_;
};

}  // namespace kvstrand::tier
