#include "tier/size_classes.hpp"

#include <algorithm>

#include "tier/arena.hpp"

namespace kvstrand::tier {

namespace {
constexpr int kClassShift = 48;
}

void SizeClasses::set_pools(std::vector<std::uint32_t> ends) {
  pool_ends_ = std::move(ends);
  free_slabs_.assign(std::max<std::size_t>(pool_ends_.size(), 1), {});
}

std::size_t SizeClasses::pool_of_slab(std::uint32_t slab) const noexcept {
  return static_cast<std::size_t>(std::upper_bound(pool_ends_.begin(), pool_ends_.end(), slab) - pool_ends_.begin());
}

std::size_t SizeClasses::pool_of(const Index& idx) const {
  const std::size_t i = class_of(idx);
  return i == classes_.size() ? 0 : classes_[i].pool;
}

std::size_t SizeClasses::free_slabs() const noexcept {
  std::size_t n = 0;
  for (const auto& f : free_slabs_) n += f.size();
  return n;
}

Index* SizeClasses::index(std::uint64_t object_bytes, std::size_t pool) {
  for (Class& c : classes_)
    if (c.index->object_bytes() == object_bytes && c.pool == pool) return c.index.get();
  if (object_bytes == 0 || object_bytes > slab_bytes_ || classes_.size() >= kMaxClasses || pool >= pools())
    return nullptr;
  const SlabGeometry g = geometry(object_bytes);
  if (g.per_slab == 0) return nullptr;  // an object (with its entry or prefix) does not fit a slab
  Class c;
  c.per_slab = g.per_slab;
  c.first_object = g.first_object;
  c.stride = g.stride;
  c.pool = pool;
  c.index = std::make_unique<Index>(object_bytes);
  if (slab_count_ != 0) {
    const std::uint64_t pool_slabs =
        pool_ends_.empty() ? slab_count_ : pool_ends_[pool] - (pool == 0 ? 0 : pool_ends_[pool - 1]);
    c.index->limit_slots(pool_slabs * g.per_slab);
  }
  c.index->issue_random_holds(static_cast<HoldId>(classes_.size() + 1) << kClassShift);
  if (tenants_) c.index->set_tenants(tenants_);
  if (table_) {
    c.journal = std::make_unique<Journal>();
    c.journal->owner = this;
    c.journal->cls = classes_.size();
    c.index->set_listener(c.journal.get());
  }
  classes_.push_back(std::move(c));
  if (on_made_) on_made_(*classes_.back().index);
  return classes_.back().index.get();
}

std::set<kv::Digest> SizeClasses::namespaces_of(TenantId tenant) const {
  std::set<kv::Digest> out;
  for (const Class& c : classes_) c.index->namespaces_of(tenant, out);
  return out;
}

void SizeClasses::set_tenants(TenantBook* book) {
  tenants_ = book;
  for (Class& c : classes_) c.index->set_tenants(book);
}

void SizeClasses::on_class_made(ClassMade f) {
  on_made_ = std::move(f);
  for (Class& c : classes_) on_made_(*c.index);
}

std::vector<Index*> SizeClasses::indexes() const {
  std::vector<Index*> out;
  for (const Class& c : classes_) out.push_back(c.index.get());
  return out;
}

SlabGeometry SizeClasses::geometry(std::uint64_t object_bytes) const noexcept {
  if (object_bytes == 0 || object_bytes > slab_bytes_) return {};
  if (table_) return described_geometry(slab_bytes_, object_bytes, shape_.align);
  SlabGeometry g;
  g.stride = stride(object_bytes);
  g.first_object = (shape_.slab_header + shape_.align - 1) / shape_.align * shape_.align;
  g.per_slab = g.first_object >= slab_bytes_ ? 0 : Arena::slots_per_slab(slab_bytes_ - g.first_object, g.stride);
  return g;
}

void SizeClasses::add_slab(std::uint32_t slab) {
  if (slab < adopted_.size() && adopted_[slab]) return;
  const std::size_t pool = pool_of_slab(slab);
  // A slab past the last pool's end belongs to none: never handed out.
  if (pool < free_slabs_.size()) free_slabs_[pool].push_back(slab);
}

Index* SizeClasses::adopt_slab(std::uint32_t slab, std::uint64_t object_bytes,
                               std::span<const std::optional<Index::Restored>> restored, std::size_t* duplicates) {
  Index* idx = index(object_bytes);
  if (idx == nullptr) return nullptr;
  Class& c = classes_[class_of(*idx)];
  if (restored.size() != c.per_slab) return nullptr;
  if (adopted_.size() <= slab) adopted_.resize(slab + 1, false);
  adopted_[slab] = true;
  c.slabs.push_back(slab);
  const std::size_t dropped = idx->add_restored_slots(restored);
  if (duplicates) *duplicates += dropped;
  return idx;
}

void SizeClasses::give_slab(Class& c, std::uint32_t slab) {
  // The slab's slots are handed out only after the table says whose they
  // are and holds no entry of an earlier life: before this returns.
  // The allocations first (all or nothing: std::bad_alloc leaves the class
  // as it was), then the table and the listener before give_slab returns.
  c.slabs.reserve(c.slabs.size() + 1);
  c.index->add_slots(c.per_slab);
  c.slabs.push_back(slab);  // within the capacity reserved: no allocation
  if (table_) table_->slab_assigned(slab, c.index->object_bytes());
  if (on_assigned_) on_assigned_(slab, c.index->object_bytes());
}

void SizeClasses::Journal::reserved(std::uint32_t slot, const kv::ChunkKey& key, bool has_image) {
  const Class& c = owner->classes_[cls];
  // The object's tenant kept with it (by tag), so a restart knows whose it is.
  const std::uint64_t tag = owner->tenants_ ? owner->tenants_->tag(c.index->tenant_at(slot)) : 0;
  owner->table_->reserved(c.slabs[slot / c.per_slab], slot % c.per_slab, key, has_image, tag);
}

void SizeClasses::Journal::committed(std::uint32_t slot) {
  const Class& c = owner->classes_[cls];
  owner->table_->committed(c.slabs[slot / c.per_slab], slot % c.per_slab);
}

void SizeClasses::Journal::freed(std::uint32_t slot) {
  const Class& c = owner->classes_[cls];
  owner->table_->freed(c.slabs[slot / c.per_slab], slot % c.per_slab);
}

std::size_t SizeClasses::class_of(const Index& idx) const {
  std::size_t i = 0;
  while (i < classes_.size() && classes_[i].index.get() != &idx) ++i;
  return i;
}

void SizeClasses::make_room(Index& idx, std::size_t want) {
  const std::size_t i = class_of(idx);
  if (i == classes_.size()) return;
  Class& c = classes_[i];
  auto& free = free_slabs_[c.pool];
  while (idx.free_slots() < want && !free.empty()) {
    const std::uint32_t slab = free.front();
    give_slab(c, slab);  // may throw std::bad_alloc: the slab stays free, the index as it was
    free.pop_front();
  }
}

std::size_t SizeClasses::room(const Index& idx) const {
  const std::size_t i = class_of(idx);
  if (i == classes_.size()) return idx.free_slots() + idx.evictable();
  return idx.free_slots() + idx.evictable() + free_slabs_[classes_[i].pool].size() * classes_[i].per_slab;
}

std::uint64_t SizeClasses::offset_of(const Index& idx, std::uint32_t slot) const {
  const Class& c = classes_.at(class_of(idx));
  return static_cast<std::uint64_t>(c.slabs.at(slot / c.per_slab)) * slab_bytes_ + c.first_object +
         static_cast<std::uint64_t>(slot % c.per_slab) * c.stride + shape_.prefix;
}

Index* SizeClasses::index_of_hold(HoldId id) {
  const std::uint64_t n = id >> kClassShift;
  if (n == 0 || n > classes_.size()) return nullptr;
  return classes_[n - 1].index.get();
}

std::size_t SizeClasses::release_owner(Owner owner) {
  std::size_t n = 0;
  for (Class& c : classes_) n += c.index->release_owner(owner);
  return n;
}

Index::Held SizeClasses::held_by(Owner owner) const {
  Index::Held all;
  for (const Class& c : classes_) {
    const Index::Held h = c.index->held_by(owner);
    all.leases += h.leases;
    all.reservations += h.reservations;
    all.leased_bytes += h.leased_bytes;
    all.reserved_bytes += h.reserved_bytes;
  }
  return all;
}

std::map<HoldId, std::pair<Owner, bool>> SizeClasses::holds() const {
  std::map<HoldId, std::pair<Owner, bool>> all;
  for (const Class& c : classes_) all.merge(c.index->holds());
  return all;
}

std::size_t SizeClasses::drop_namespace(const kv::Digest& ns,
                                       const std::function<void(const Index& index, std::uint32_t slot)>& each) {
  std::size_t n = 0;
  for (Class& c : classes_) {
    const Index& idx = *c.index;
    n += c.index->drop_namespace(ns, each ? std::function<void(std::uint32_t)>([&](std::uint32_t s) { each(idx, s); })
                                          : std::function<void(std::uint32_t)>{});
  }
  return n;
}

std::map<kv::Digest, std::uint64_t> SizeClasses::namespace_bytes() const {
  std::map<kv::Digest, std::uint64_t> out;
  for (const Class& c : classes_)
    for (const auto& [ns, objects] : c.index->namespaces()) out[ns] += objects * c.index->object_bytes();
  return out;
}

Index::Stats SizeClasses::stats() const { return sum(true); }
Index::Stats SizeClasses::counters() const { return sum(false); }

Index::Stats SizeClasses::sum(bool objects) const {
  Index::Stats all;
  for (const Class& c : classes_) {
    const Index::Stats s = objects ? c.index->stats() : c.index->counters();
    all.capacity_bytes += s.capacity_bytes;
    all.used_bytes += s.used_bytes;
    all.objects += s.objects;
    all.writing += s.writing;
    all.pinned += s.pinned;
    all.leases += s.leases;
    all.reservations += s.reservations;
    all.evictions += s.evictions;
    all.refused_full += s.refused_full;
    all.dropped += s.dropped;
    all.lookup_hits += s.lookup_hits;
    all.lookup_misses += s.lookup_misses;
    all.lookup_asked += s.lookup_asked;
    all.committed += s.committed;
  }
  return all;
}

std::vector<SizeClasses::ClassInfo> SizeClasses::classes() const {
  std::vector<ClassInfo> out;
  for (const Class& c : classes_) out.push_back({c.index->object_bytes(), c.slabs.size()});
  return out;
}

}  // namespace kvstrand::tier
