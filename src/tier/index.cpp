#include "tier/index.hpp"

#include <sys/random.h>

#include <algorithm>
#include <array>
#include <cstdint>

namespace kvstrand::tier {

Index::Index(std::uint64_t capacity_bytes, std::uint64_t object_bytes) : object_bytes_(object_bytes) {
  const std::uint64_t n = object_bytes == 0 ? 0 : capacity_bytes / object_bytes;
  add_slots(static_cast<std::uint32_t>(std::min<std::uint64_t>(n, UINT32_MAX)));
}

std::uint64_t Index::bytes_per_slot() noexcept {
  return sizeof(Object) + sizeof(std::uint32_t) + 2 * sizeof(std::uint64_t);
}

void Index::add_slots(std::uint32_t count) {
  // Every allocation first, the largest first, then nothing that can
  // throw: a slab that cannot be indexed (std::bad_alloc) leaves the index
  // as it was.
  const std::size_t need = static_cast<std::size_t>(slots_) + count;
  if (objects_.capacity() < need) {
    // A quarter more room than needed: reserved exactly, each slab added
    // would copy every entry before it (a fill of 10M objects quadratic, a
    // strand stalled longer at each new slab: docs/PERFORMANCE.md,
    // bench_recovery). Never past the most slots this index can have
    // (--max-index-bytes counts those).
    const std::size_t grown = std::max(need, objects_.capacity() + objects_.capacity() / 4);
    objects_.reserve(std::max<std::size_t>(need, std::min<std::uint64_t>(grown, slot_limit_)));
  }
  std::vector<std::uint32_t> free_list;
  free_list.reserve(free_.size() + count);
  std::size_t capacity = 16;
  while (capacity < 2 * (static_cast<std::size_t>(slots_) + count)) capacity *= 2;
  std::vector<std::uint64_t> table;
  if (capacity > table_.size()) table.assign(capacity, 0);  // a slab's worth at a time, never while serving a request
  // Lowest slot numbers are handed out first (free_ is a stack).
  for (std::uint32_t i = count; i > 0; --i) free_list.push_back(slots_ + i - 1);
  free_list.insert(free_list.end(), free_.begin(), free_.end());
  free_.swap(free_list);
  slots_ += count;
  objects_.resize(slots_);  // within the capacity reserved: no allocation
  if (!table.empty()) rebuild_table(std::move(table));
}

std::size_t Index::add_restored_slots(std::span<const std::optional<Restored>> restored) {
  const std::uint32_t base = slots_;
  const auto n = static_cast<std::uint32_t>(restored.size());
  add_slots(n);
  std::size_t dropped = 0;
  std::vector<bool> taken(n, false);
  for (std::uint32_t i = 0; i < n; ++i) {
    if (!restored[i]) continue;
    const std::uint32_t h = hash_of(restored[i]->key);
    if (find(restored[i]->key, h) != kNone) {
      ++dropped;
      continue;
    }
    Object& o = objects_[base + i];
    o.key = restored[i]->key;
    o.hash = h;
    o.used = true;
    o.has_image = restored[i]->has_image;
    o.committed = true;
    table_insert(h, base + i);
    ++stored_;
    ++per_namespace_[o.key.ns];
    // Its tenant, by the tag the table or the disk kept: resolved now, or
    // when the tenants are set (set_tenants).
    if (tenants_) {
      o.tenant = tenants_->id_of_tag(restored[i]->tenant_tag).value_or(0);
      tenants_->charge(o.tenant, object_bytes_);
    } else if (restored[i]->tenant_tag != 0) {
      if (restored_tags_.size() < slots_) restored_tags_.resize(slots_, 0);
      restored_tags_[base + i] = restored[i]->tenant_tag;
    }
    ++evictable_;
    taken[i] = true;
  }
  std::erase_if(free_, [&](std::uint32_t s) { return s >= base && s < base + n && taken[s - base]; });
  return dropped;
}

// ---- the key table ----------------------------------------------------------------

void Index::rebuild_table(std::vector<std::uint64_t> empty) {
  table_ = std::move(empty);
  mask_ = table_.size() - 1;
  for (std::uint32_t s = 0; s < objects_.size(); ++s)
    if (objects_[s].used) table_insert(objects_[s].hash, s);
}

void Index::prefetch(std::uint32_t hash) const noexcept {
  if (!table_.empty()) __builtin_prefetch(&table_[hash & mask_]);
}

// The object the key's first table entry names (a guess: the entry usually
// is the key's own).
void Index::prefetch_object(std::uint32_t hash) const noexcept {
  if (table_.empty()) return;
  const std::uint64_t e = table_[hash & mask_];
  if (e != 0) __builtin_prefetch(&objects_[(e & 0xffffffffu) - 1]);
}

std::uint32_t Index::find(const kv::ChunkKey& key, std::uint32_t hash) const noexcept {
  if (table_.empty()) return kNone;
  for (std::uint64_t pos = hash & mask_;; pos = (pos + 1) & mask_) {
    const std::uint64_t e = table_[pos];
    if (e == 0) return kNone;
    if ((e >> 32) != hash) continue;
    const auto slot = static_cast<std::uint32_t>((e & 0xffffffffu) - 1);
    if (objects_[slot].key == key) return slot;
  }
}

std::uint32_t Index::find_after(const kv::ChunkKey& key, std::uint32_t hash, std::uint32_t before) const noexcept {
  // Keys are unique and a used object is in the table: the table's answer.
  if (before != kNone && before + 1 < slots_) {
    const Object& o = objects_[before + 1];
    if (o.used && o.hash == hash && o.key == key) return before + 1;
  }
  return find(key, hash);
}

void Index::table_insert(std::uint32_t hash, std::uint32_t slot) {
  std::uint64_t pos = hash & mask_;
  while (table_[pos] != 0) pos = (pos + 1) & mask_;
  table_[pos] = (static_cast<std::uint64_t>(hash) << 32) | (static_cast<std::uint64_t>(slot) + 1);
}

void Index::table_erase(std::uint32_t hash, std::uint32_t slot) {
  const std::uint64_t want = (static_cast<std::uint64_t>(hash) << 32) | (static_cast<std::uint64_t>(slot) + 1);
  std::uint64_t i = hash & mask_;
  while (table_[i] != want) i = (i + 1) & mask_;
  // Backward shift: later entries of the probe run move up into the hole,
  // unless their own start position lies cyclically in (hole, entry].
  table_[i] = 0;
  for (std::uint64_t j = (i + 1) & mask_; table_[j] != 0; j = (j + 1) & mask_) {
    const std::uint64_t home = (table_[j] >> 32) & mask_;
    if (((j - home) & mask_) >= ((j - i) & mask_)) {
      table_[i] = table_[j];
      table_[j] = 0;
      i = j;
    }
  }
}

// ---- objects ------------------------------------------------------------------------

void Index::set_tenants(TenantBook* book) {
  if (tenants_)
    for (const Object& o : objects_)
      if (o.used) tenants_->credit(o.tenant, object_bytes_);
  tenants_ = book;
  if (!tenants_) return;
  // Objects found again at a restart: their tenants, by the tags kept.
  for (std::uint32_t s = 0; s < restored_tags_.size(); ++s)
    if (objects_[s].used && restored_tags_[s] != 0) objects_[s].tenant = tenants_->id_of_tag(restored_tags_[s]).value_or(0);
  std::vector<std::uint64_t>().swap(restored_tags_);
  for (const Object& o : objects_)
    if (o.used) tenants_->charge(o.tenant, object_bytes_);
}

void Index::namespaces_of(TenantId tenant, std::set<kv::Digest>& out) const {
  for (const Object& o : objects_)
    if (o.used && !o.dropped && o.tenant == tenant) out.insert(o.key.ns);
}

void Index::add_reader(Object& o) {
  if (o.readers++ == 0 && o.committed) --evictable_;
}

void Index::drop_reader(Object& o) {
  if (o.readers == 0) return;
  if (--o.readers != 0 || !o.committed) return;
  if (o.dropped) {
    free_slot(static_cast<std::uint32_t>(&o - objects_.data()));
    return;
  }
  ++evictable_;
}

void Index::free_slot(std::uint32_t slot) {
  Object& o = objects_[slot];
  if (tenants_) tenants_->credit(o.tenant, object_bytes_);
  table_erase(o.hash, slot);
  if (auto ns = per_namespace_.find(o.key.ns); ns != per_namespace_.end() && --ns->second == 0) per_namespace_.erase(ns);
  o = Object{};
  free_.push_back(slot);
  --stored_;
  for (Listener* l : {listener_, observer_})
    if (l) l->freed(slot);
}

bool Index::evict_one(TenantId tenant) {
  if (evictable_ == 0) return false;
  if (!tenants_) return evict_matching([](const Object&) { return true; });
  // TenantBook's rule: its own objects, and others' whose tenant keeps its
  // quota without them; its own first once it would pass its own quota.
  const auto own = [&](const Object& o) { return o.tenant == tenant; };
  const auto spare = [&](const Object& o) {
    return o.tenant != tenant && tenants_->can_spare(o.tenant, object_bytes_);
  };
  if (tenants_->would_pass(tenant, object_bytes_)) return evict_matching(own) || evict_matching(spare);
  return evict_matching([&](const Object& o) { return own(o) || spare(o); });
}

template <class May>
bool Index::evict_matching(May may) {
  // Ends: two turns of the hand give every object it may take one second
  // chance and then that object; none found in them, none is there.
  for (std::uint64_t seen = 0; seen < 2 * std::uint64_t{slots_}; ++seen) {
    const std::uint32_t s = hand_;
    hand_ = hand_ + 1 == slots_ ? 0 : hand_ + 1;
    Object& o = objects_[s];
    if (!o.used || !o.committed || o.readers != 0) continue;  // free, being written, or held
    if (!may(o)) continue;  // another tenant's reserve: its reference bit is left as it is
    if (o.referenced) {
      o.referenced = false;
      continue;
    }
    evict_slot(s);
    return true;
  }
  return false;
}

void Index::evict_slot(std::uint32_t s) {
  const Object& o = objects_[s];
  if (tenants_) tenants_->count_eviction(o.tenant);
  const std::uint64_t fp = ChunkKeyHash{}(o.key);
  ++evicted_[fp];
  evicted_order_.push_back(fp);
  if (evicted_order_.size() > kRememberedEvictions) {
    const auto oldest = evicted_.find(evicted_order_.front());
    if (--oldest->second == 0) evicted_.erase(oldest);
    evicted_order_.pop_front();
  }
  free_slot(s);
  --evictable_;
  ++stats_.evictions;
}

Index::Reserve Index::reserve(const kv::ChunkKey& key, bool has_image, std::uint32_t* slot, TenantId tenant) {
  const std::uint32_t h = hash_of(key);
  if (find(key, h) != kNone) return Reserve::exists;
  if (free_.empty() && !evict_one(tenant)) {
    ++stats_.refused_full;
    return Reserve::full;
  }
  // The one allocation (a namespace's first object) before the slot is
  // taken: std::bad_alloc here leaves no slot half used.
  std::size_t& in_namespace = per_namespace_[key.ns];
  const std::uint32_t s = free_.back();
  free_.pop_back();
  Object& o = objects_[s];
  o.key = key;
  o.hash = h;
  o.used = true;
  o.has_image = has_image;
  o.tenant = tenant;
  if (tenants_) tenants_->charge(tenant, object_bytes_);
  table_insert(h, s);
  ++stored_;
  ++in_namespace;
  *slot = s;
  for (Listener* l : {listener_, observer_})
    if (l) l->reserved(s, key, has_image);
  return Reserve::reserved;
}

void Index::commit_slot(std::uint32_t slot) {
  Object& o = objects_[slot];
  if (!o.used || o.committed) return;
  if (o.dropped) {  // written before the drop came: never readable
    free_slot(slot);
    return;
  }
  o.committed = true;
  ++stats_.committed;
  o.referenced = false;
  if (o.readers == 0) ++evictable_;
  for (Listener* l : {listener_, observer_})
    if (l) l->committed(slot);
}

void Index::abort_slot(std::uint32_t slot) {
  if (objects_[slot].used && !objects_[slot].committed) free_slot(slot);
}

void Index::commit(const kv::ChunkKey& key) {
  if (const std::uint32_t s = find(key, hash_of(key)); s != kNone) commit_slot(s);
}

void Index::abort(const kv::ChunkKey& key) {
  if (const std::uint32_t s = find(key, hash_of(key)); s != kNone) abort_slot(s);
}

bool Index::erase(const kv::ChunkKey& key) {
  const std::uint32_t s = find(key, hash_of(key));
  if (s == kNone || !objects_[s].committed || objects_[s].readers != 0) return false;
  free_slot(s);
  --evictable_;
  return true;
}

bool Index::evicted_recently(const kv::ChunkKey& key) const { return evicted_.contains(ChunkKeyHash{}(key)); }

std::size_t Index::drop_namespace(const kv::Digest& ns, const std::function<void(std::uint32_t slot)>& each) {
  std::size_t n = 0;
  for (std::uint32_t s = 0; s < slots_; ++s) {
    Object& o = objects_[s];
    if (!o.used || o.dropped || o.key.ns != ns) continue;
    ++n;
    if (each) each(s);
    if (o.committed && o.readers == 0) {
      free_slot(s);
      --evictable_;
      continue;
    }
    o.dropped = true;
    // Gone from the persistent table now: a restart before its holder lets
    // go must not find it again.
    for (Listener* l : {listener_, observer_})
      if (l) l->freed(s);
  }
  stats_.dropped += n;
  return n;
}

kv::HitSource Index::run(std::span<const kv::ChunkKey> keys, std::uint32_t chunk_tokens,
                         std::vector<std::uint32_t>* locked) {
  // Fetched ahead, so that a large index's cache misses overlap instead of
  // adding up: the table entry of a key kTable on (unless the slots run in
  // order as far), then kObject on the object that entry names.
  constexpr std::size_t kTable = 16, kObject = 8;
  std::vector<std::uint32_t> hashes(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) hashes[i] = hash_of(keys[i]);
  std::array<bool, kTable> by_table;  // by key number mod kTable: its table entry was fetched
  by_table.fill(true);
  for (std::size_t i = 0; i < std::min(kTable, keys.size()); ++i) prefetch(hashes[i]);
  kv::HitSource h;
  std::uint32_t n = 0;
  std::uint32_t s = kNone;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (i + kObject < keys.size() && by_table[(i + kObject) % kTable]) prefetch_object(hashes[i + kObject]);
    // Token counts are 32-bit: a run ends before the chunk whose end would
    // not fit (a wrapped count once leased 8 KiB as "0 tokens" past a quota).
    if ((static_cast<std::uint64_t>(n) + 1) * chunk_tokens > UINT32_MAX) break;
    const std::uint32_t before = s;
    s = find_after(keys[i], hashes[i], before);
    if (s == kNone || !objects_[s].committed || objects_[s].dropped) break;
    if (const std::size_t next = i + kTable; next < keys.size()) {
      // The slot kTable on is read only where the slots run in order: elsewhere it is one more cache miss.
      by_table[next % kTable] = before == kNone || s != before + 1 || !may_hold(std::uint64_t{s} + kTable, hashes[next]);
      if (by_table[next % kTable]) prefetch(hashes[next]);
    }
    Object& o = objects_[s];
    o.referenced = true;
    if (locked) {
      add_reader(o);
      locked->push_back(s);
    }
    ++n;
    if (o.has_image) h.checkpoints.push_back(n * chunk_tokens);
  }
  h.tokens = n * chunk_tokens;
  stats_.lookup_hits += n;
  stats_.lookup_asked += keys.size();
  if (n < keys.size()) ++stats_.lookup_misses;
  return h;
}

kv::HitSource Index::lookup(std::span<const kv::ChunkKey> keys, std::uint32_t chunk_tokens) {
  return run(keys, chunk_tokens, nullptr);
}

std::optional<std::vector<std::uint32_t>> Index::read_lock(std::span<const kv::ChunkKey> keys) {
  std::vector<std::uint32_t> slots;
  slots.reserve(keys.size());  // one allocation, not one per doubling: a load's hold is on its latency path
  std::uint32_t s = kNone;
  for (const kv::ChunkKey& k : keys) {
    s = find_after(k, hash_of(k), s);
    if (s == kNone || !objects_[s].committed || objects_[s].dropped) return std::nullopt;
    slots.push_back(s);
  }
  for (std::uint32_t s : slots) {
    add_reader(objects_[s]);
    objects_[s].referenced = true;
  }
  return slots;
}

void Index::read_unlock(std::span<const kv::ChunkKey> keys) {
  std::uint32_t s = kNone;
  for (const kv::ChunkKey& k : keys)
    if ((s = find_after(k, hash_of(k), s)) != kNone) drop_reader(objects_[s]);
}

bool Index::has_image(const kv::ChunkKey& key) const {
  const std::uint32_t s = find(key, hash_of(key));
  return s != kNone && objects_[s].has_image;
}

// ---- holds ------------------------------------------------------------------------

std::size_t Index::present_run(std::span<const kv::ChunkKey> keys) const {
  std::size_t n = 0;
  std::uint32_t s = kNone;
  for (const kv::ChunkKey& k : keys) {
    s = find_after(k, hash_of(k), s);
    if (s == kNone || !objects_[s].committed || objects_[s].dropped) break;
    ++n;
  }
  return n;
}

std::size_t Index::absent(std::span<const kv::ChunkKey> keys) const {
  std::size_t n = 0;
  for (const kv::ChunkKey& k : keys) n += find(k, hash_of(k)) == kNone;
  return n;
}

Owner Index::owner_of(HoldId id) const {
  auto it = holds_.find(id);
  return it == holds_.end() ? 0 : it->second.owner;
}

bool Index::adoptable(HoldId id) const {
  auto it = holds_.find(id);
  return it != holds_.end() && it->second.lease && !it->second.adopted;
}

void Index::adopt(HoldId id, Owner owner) {
  auto it = holds_.find(id);
  if (it == holds_.end() || !it->second.lease || it->second.adopted) return;
  it->second.owner = owner;
  it->second.adopted = true;
}

std::vector<std::uint32_t> Index::hold_slots(HoldId id) const {
  auto it = holds_.find(id);
  return it == holds_.end() ? std::vector<std::uint32_t>{} : it->second.slots;
}

Index::Lease Index::lease(std::span<const kv::ChunkKey> keys, std::uint32_t chunk_tokens, Owner owner) {
  Lease l;
  l.hit = run(keys, chunk_tokens, &l.slots);
  if (l.slots.empty()) return l;
  l.id = new_hold();
  holds_.emplace(l.id, Hold{owner, true, l.slots});
  return l;
}

Index::Reservation Index::reserve(std::span<const kv::ChunkKey> keys, std::span<const bool> images, Owner owner,
                                  TenantId tenant) {
  Reservation r;
  r.chunks.resize(keys.size(), Chunk::full);
  r.slots.resize(keys.size(), 0);
  // All or nothing: the hold (its map node, its slot list, its id) is made
  // before any slot is taken, and a throw while taking them (std::bad_alloc)
  // gives back those taken: the index is as it was.
  std::map<HoldId, Hold> made;
  made.emplace(new_hold(), Hold{owner, false, {}});
  auto node = made.extract(made.begin());
  Hold& h = node.mapped();
  h.slots.reserve(keys.size());
  for (const kv::ChunkKey& k : keys) prefetch(hash_of(k));
  // The objects the hand will evict for them: their table entries too.
  if (free_.size() < keys.size() && evictable_ > 0) {
    std::size_t want = keys.size() - free_.size();
    // A look a little way ahead only: what the hand meets is evicted in
    // about this order.
    const std::uint32_t look = std::min<std::uint32_t>(slots_, 4 * static_cast<std::uint32_t>(want) + 64);
    for (std::uint32_t s = hand_, seen = 0; want > 0 && seen < look; ++seen, s = s + 1 == slots_ ? 0 : s + 1) {
      const Object& o = objects_[s];
      if (!o.used || !o.committed || o.readers != 0 || o.referenced) continue;
      prefetch(o.hash);
      --want;
    }
  }
  try {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      switch (reserve(keys[i], i < images.size() && images[i], &r.slots[i], tenant)) {
        case Reserve::reserved:
          r.chunks[i] = Chunk::reserved;
          ++r.reserved;
          h.slots.push_back(r.slots[i]);  // within the capacity reserved
          break;
        case Reserve::exists:
          r.chunks[i] = Chunk::existed;
          ++r.existed;
          break;
        case Reserve::full: ++r.full; break;
      }
    }
  } catch (...) {
    for (std::uint32_t slot : h.slots) abort_slot(slot);
    throw;
  }
  if (!h.slots.empty()) {
    r.id = node.key();
    holds_.insert(std::move(node));  // a node made already: no allocation
  }
  return r;
}

HoldId Index::new_hold() {
  if (!random_holds_) return next_hold_++;
  constexpr HoldId kLow = (HoldId{1} << 48) - 1;
  for (;;) {
    if (random_.empty()) {
      // The kernel's CSPRNG, 64 ids at a time (a syscall per 64 holds).
      random_.resize(64);
      std::size_t at = 0;
      auto* bytes = reinterpret_cast<unsigned char*>(random_.data());
      while (at < random_.size() * sizeof(std::uint64_t)) {
        const ssize_t n = ::getrandom(bytes + at, random_.size() * sizeof(std::uint64_t) - at, 0);
        if (n > 0) at += static_cast<std::size_t>(n);
      }
    }
    const HoldId id = hold_prefix_ | (random_.back() & kLow);
    random_.pop_back();
    if ((id & kLow) != 0 && !holds_.contains(id)) return id;
  }
}

bool Index::commit(HoldId id, bool ok) {
  auto it = holds_.find(id);
  if (it == holds_.end() || it->second.lease) return false;
  for (std::uint32_t slot : it->second.slots) ok ? commit_slot(slot) : abort_slot(slot);
  holds_.erase(it);
  return true;
}

bool Index::release(HoldId id) {
  auto it = holds_.find(id);
  if (it == holds_.end()) return false;
  for (std::uint32_t slot : it->second.slots) it->second.lease ? drop_reader(objects_[slot]) : abort_slot(slot);
  holds_.erase(it);
  return true;
}

std::size_t Index::release_owner(Owner owner) {
  std::vector<HoldId> ids;
  for (const auto& [id, h] : holds_)
    if (h.owner == owner) ids.push_back(id);
  for (HoldId id : ids) release(id);
  return ids.size();
}

Index::Held Index::held_by(Owner owner) const {
  Held out;
  for (const auto& [id, h] : holds_) {
    if (h.owner != owner) continue;
    const std::uint64_t bytes = h.slots.size() * object_bytes_;
    if (h.lease) {
      ++out.leases;
      out.leased_bytes += bytes;
    } else {
      ++out.reservations;
      out.reserved_bytes += bytes;
    }
  }
  return out;
}

std::map<HoldId, std::pair<Owner, bool>> Index::holds() const {
  std::map<HoldId, std::pair<Owner, bool>> out;
  for (const auto& [id, h] : holds_) out[id] = {h.owner, h.lease};
  return out;
}

Index::Stats Index::counters() const {
  Stats s = stats_;
  s.capacity_bytes = static_cast<std::uint64_t>(slots_) * object_bytes_;
  s.used_bytes = static_cast<std::uint64_t>(stored_) * object_bytes_;
  return s;
}

Index::Stats Index::stats() const {
  Stats s = counters();
  for (const Object& o : objects_) {
    if (!o.used) continue;
    if (o.committed) {
      ++s.objects;
      if (o.readers) ++s.pinned;
    } else {
      ++s.writing;
    }
  }
  for (const auto& [id, h] : holds_) (h.lease ? s.leases : s.reservations) += 1;
  return s;
}

}  // namespace kvstrand::tier

