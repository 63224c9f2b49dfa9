// An arena's slabs shared by objects of several sizes: one Index per object
// size (a "class"), each over the slabs given to it.
//
// Hybrid models register several KV-cache groups whose chunk objects differ
// in size (an attention group, a sliding-window group, a draft model's
// cache). Each size gets its own Index, so eviction, holds and the hash
// table work as for one size. Rules:
// - A ready slab starts unassigned. A class takes one only when it has no
//   free slot for what it is asked to hold (make_room), so with one size
//   every ready slab ends up in its class, as before there were classes.
// - A slab, once given to a class, stays there (no rebalancing between
//   sizes): when every slab is given, a class evicts its own objects only.
// - Hold ids carry their class (class number in the top 16 bits), so a
//   release or commit, which names only the hold, finds its index.
// - With an ObjectTable (a persistent arena), slabs are described: each
//   keeps its class's object table before its objects (fewer slots a
//   slab), and every change to an object is written there as it happens.
// - Slots may be shaped (SlotShape): aligned for O_DIRECT, with room before
//   each object and at a slab's start for a header of the caller's (the
//   disk tier's extents); told of each slab a class takes.
// - Pools (kvstrand-server --tenant-segment): the slabs may be split into
//   ranges, each its own memory (a tenant's segment; pool 0 the shared
//   arena). A class is of one pool and takes slabs of its pool only, so an
//   object of one pool never lands in another's memory.
// No I/O and no memory of its own but the table's (the Arena turns offsets
// into places).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include <optional>
#include <span>

#include "tier/index.hpp"
#include "tier/object_table.hpp"

namespace kvstrand::tier {

// How a slab lays out its slots: each `align`-aligned, `prefix` bytes before
// each object (offset_of is the object's, after them), the first slot after
// `slab_header` bytes. The default is objects back to back.
struct SlotShape {
  std::uint64_t align = 1;
  std::uint64_t prefix = 0;
  std::uint64_t slab_header = 0;
};

class SizeClasses {
 public:
  static constexpr std::size_t kMaxClasses = 64;

  // With a table, slots are aligned to its align() (and shape is ignored).
  explicit SizeClasses(std::uint64_t slab_bytes, ObjectTable* table = nullptr, SlotShape shape = {})
      : slab_bytes_(slab_bytes), table_(table), shape_(table ? SlotShape{table->align(), 0, 0} : shape) {}
  // Told of each slab as a class takes it, before any of its slots is handed out.
  using SlabAssigned = std::function<void(std::uint32_t slab, std::uint64_t object_bytes)>;
  void on_slab_assigned(SlabAssigned f) { on_assigned_ = std::move(f); }
  // Told of each class's index: those made already at once, each later one
  // as it is made (the server's KV events watch them all).
  using ClassMade = std::function<void(Index& index)>;
  void on_class_made(ClassMade f);
  // Every class's index (the objects a restarted server found).
  std::vector<Index*> indexes() const;
  // The namespaces of `tenant`'s objects in every class.
  std::set<kv::Digest> namespaces_of(TenantId tenant) const;
  // Tenants' shares over every class, made now or later (Index::set_tenants).
  void set_tenants(TenantBook* book);
  SizeClasses(const SizeClasses&) = delete;
  SizeClasses& operator=(const SizeClasses&) = delete;

  // How many slabs there are in all (the arena's, the disk's extents),
  // before any class is made: each class's index then never makes room for
  // more slots than its pool's slabs hold (Index::limit_slots).
  void set_slab_count(std::uint32_t slabs) noexcept { slab_count_ = slabs; }
  // Splits the slabs into pools before any is added: pool p is slabs
  // [ends[p-1], ends[p]) (pool 0 from slab 0). Unset: one pool of them all.
  void set_pools(std::vector<std::uint32_t> ends);
  std::size_t pools() const noexcept { return free_slabs_.size(); }
  std::size_t pool_of_slab(std::uint32_t slab) const noexcept;
  // Where pool p's first slab lies, in bytes (0 for pool 0).
  std::uint64_t pool_base(std::size_t pool) const noexcept {
    return pool == 0 || pool > pool_ends_.size() ? 0 : std::uint64_t{pool_ends_[pool - 1]} * slab_bytes_;
  }
  // Pool p's bytes (0 when the slabs were never split).
  std::uint64_t pool_bytes(std::size_t pool) const noexcept {
    return pool >= pool_ends_.size() ? 0 : std::uint64_t{pool_ends_[pool]} * slab_bytes_ - pool_base(pool);
  }
  // The pool of idx's class.
  std::size_t pool_of(const Index& idx) const;

  // A populated slab that no class uses yet (one a class took already, by
  // adopt_slab, is left where it is).
  void add_slab(std::uint32_t slab);
  // A slab a class had in the server's earlier life, with the objects its
  // table still holds (ObjectTable::scan): its class's index gets them as
  // committed objects. Null when no class can take `object_bytes`.
  Index* adopt_slab(std::uint32_t slab, std::uint64_t object_bytes,
                    std::span<const std::optional<Index::Restored>> restored, std::size_t* duplicates);
  bool described() const noexcept { return table_ != nullptr; }
  std::size_t free_slabs() const noexcept;
  std::uint64_t slab_bytes() const noexcept { return slab_bytes_; }

  // The index of objects of `object_bytes` in `pool` (made on first use).
  // Null when an object would not fit a slab, kMaxClasses classes exist
  // already, or there is no such pool.
  Index* index(std::uint64_t object_bytes, std::size_t pool = 0);
  // Gives `idx` free slabs until it has `want` free slots, or none are left.
  void make_room(Index& idx, std::size_t want);
  // How many objects `idx` could take now: its free slots, what it can
  // evict, and the slots of the slabs no class has taken yet.
  std::size_t room(const Index& idx) const;
  // How a slab given to objects of `object_bytes` lays out its slots
  // (first_object is slot 0's start, before any prefix); per_slab 0: they
  // do not fit a slab.
  SlabGeometry geometry(std::uint64_t object_bytes) const noexcept;
  // Where slot `slot` of `idx` lies in the arena (its object, after the prefix).
  std::uint64_t offset_of(const Index& idx, std::uint32_t slot) const;
  // Bytes from one slot to the next for objects of `object_bytes`.
  std::uint64_t stride(std::uint64_t object_bytes) const noexcept {
    return (shape_.prefix + object_bytes + shape_.align - 1) / shape_.align * shape_.align;
  }
  const SlotShape& shape() const noexcept { return shape_; }
  // The index a hold id belongs to; null for an id no class issued.
  Index* index_of_hold(HoldId id);

  // Over every class.
  std::size_t release_owner(Owner owner);
  // `each`: told every dropped object's index and slot.
  std::size_t drop_namespace(const kv::Digest& ns,
                             const std::function<void(const Index& index, std::uint32_t slot)>& each = {});
  Index::Held held_by(Owner owner) const;
  std::map<HoldId, std::pair<Owner, bool>> holds() const;
  Index::Stats stats() const;
  Index::Stats counters() const;  // every class's Index::counters(): O(classes)
  // Bytes stored or being written, by namespace (the debug views).
  std::map<kv::Digest, std::uint64_t> namespace_bytes() const;
  // Every class: its object size and slabs (the debug views).
  struct ClassInfo {
    std::uint64_t object_bytes = 0;
    std::size_t slabs = 0;
  };
  std::vector<ClassInfo> classes() const;

 private:
  Index::Stats sum(bool objects) const;
  // Writes a class's object changes to the table: slot -> (slab, entry).
  struct Journal : Index::Listener {
    SizeClasses* owner = nullptr;
    std::size_t cls = 0;
    void reserved(std::uint32_t slot, const kv::ChunkKey& key, bool has_image) override;
    void committed(std::uint32_t slot) override;
    void freed(std::uint32_t slot) override;
  };
  struct Class {
    std::unique_ptr<Index> index;
    std::vector<std::uint32_t> slabs;  // slot s is in slabs[s / per_slab]
    std::uint32_t per_slab = 0;
    std::uint64_t first_object = 0;  // offset of slot 0 of a slab in it
    std::uint64_t stride = 0;        // from one slot to the next
    std::unique_ptr<Journal> journal;  // with a table
    std::size_t pool = 0;              // whose slabs it takes
  };
  void give_slab(Class& c, std::uint32_t slab);
  // The position of idx's class in classes_ (classes_.size(): none).
  std::size_t class_of(const Index& idx) const;

  std::uint64_t slab_bytes_;
  ObjectTable* table_;
  SlotShape shape_;
  SlabAssigned on_assigned_;
  ClassMade on_made_;
  TenantBook* tenants_ = nullptr;
  std::vector<bool> adopted_;  // by slab: a class has it from the earlier life
  std::vector<std::uint32_t> pool_ends_;  // set_pools; empty: one pool
  std::uint32_t slab_count_ = 0;          // set_slab_count; 0: unknown
  // By pool, lowest first: the filler populates in order.
  std::vector<std::deque<std::uint32_t>> free_slabs_ = std::vector<std::deque<std::uint32_t>>(1);
  std::vector<Class> classes_;
};

}  // namespace kvstrand::tier
