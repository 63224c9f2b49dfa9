#include "tier/size_classes.hpp"

#include <algorithm>

#include "tier/arena.hpp"

namespace kvstrand::tier {

namespace {
constexpr int kClassShift = 48;
}

Index* SizeClasses::index(std::uint64_t object_bytes) {
  for (Class& c : classes_)
    if (c.index->object_bytes() == object_bytes) return c.index.get();
  if (object_bytes == 0 || object_bytes > slab_bytes_ || classes_.size() >= kMaxClasses) return nullptr;
  Class c;
  const HoldId first = (static_cast<HoldId>(classes_.size() + 1) << kClassShift) + 1;
  c.index = std::make_unique<Index>(object_bytes);
  c.index->start_holds_at(first);
  c.per_slab = Arena::slots_per_slab(slab_bytes_, object_bytes);
  classes_.push_back(std::move(c));
  return classes_.back().index.get();
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
  while (idx.free_slots() < want && !free_slabs_.empty()) {
    c.slabs.push_back(free_slabs_.front());
    free_slabs_.pop_front();
    idx.add_slots(c.per_slab);
  }
}

std::size_t SizeClasses::room(const Index& idx) const {
  const std::size_t i = class_of(idx);
  const std::size_t per_slab = i == classes_.size() ? 0 : classes_[i].per_slab;
  return idx.free_slots() + idx.evictable() + free_slabs_.size() * per_slab;
}

std::uint64_t SizeClasses::offset_of(const Index& idx, std::uint32_t slot) const {
  const Class& c = classes_.at(class_of(idx));
  return static_cast<std::uint64_t>(c.slabs.at(slot / c.per_slab)) * slab_bytes_ +
         static_cast<std::uint64_t>(slot % c.per_slab) * idx.object_bytes();
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

Index::Stats SizeClasses::stats() const {
  Index::Stats all;
  for (const Class& c : classes_) {
    const Index::Stats s = c.index->stats();
    all.capacity_bytes += s.capacity_bytes;
    all.used_bytes += s.used_bytes;
    all.objects += s.objects;
    all.writing += s.writing;
    all.pinned += s.pinned;
    all.leases += s.leases;
    all.reservations += s.reservations;
    all.evictions += s.evictions;
    all.refused_full += s.refused_full;
    all.lookup_hits += s.lookup_hits;
    all.lookup_misses += s.lookup_misses;
  }
  return all;
}

std::vector<SizeClasses::ClassInfo> SizeClasses::classes() const {
  std::vector<ClassInfo> out;
  for (const Class& c : classes_) out.push_back({c.index->object_bytes(), c.slabs.size()});
  return out;
}

}  // namespace kvstrand::tier
