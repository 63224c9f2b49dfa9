#include "tier/index.hpp"

namespace kvstrand::tier {

Index::Index(std::uint64_t capacity_bytes, std::uint64_t object_bytes) : object_bytes_(object_bytes) {
  const std::uint64_t n = object_bytes == 0 ? 0 : capacity_bytes / object_bytes;
  add_slots(static_cast<std::uint32_t>(std::min<std::uint64_t>(n, UINT32_MAX)));
}

void Index::add_slots(std::uint32_t count) {
  // Lowest slot numbers are handed out first (free_ is a stack).
  std::vector<std::uint32_t> fresh;
  fresh.reserve(count);
  for (std::uint32_t i = count; i > 0; --i) fresh.push_back(slots_ + i - 1);
  free_.insert(free_.begin(), fresh.begin(), fresh.end());
  slots_ += count;
  key_of_slot_.resize(slots_);
  by_key_.reserve(slots_);  // no rehash while serving
}

void Index::add_reader(Object& o) {
  if (o.readers++ == 0 && o.committed) --evictable_;
}

void Index::drop_reader(Object& o) {
  if (o.readers == 0) return;
  if (--o.readers == 0 && o.committed) ++evictable_;
}

bool Index::evict_one() {
  // Ends: some committed object no one reads exists, and each object gets
  // at most one second chance per turn of the hand.
  if (evictable_ == 0) return false;
  for (;;) {
    const std::uint32_t s = hand_;
    hand_ = hand_ + 1 == slots_ ? 0 : hand_ + 1;
    if (!key_of_slot_[s]) continue;
    auto it = by_key_.find(*key_of_slot_[s]);
    Object& o = it->second;
    if (!o.committed || o.readers != 0) continue;  // being written, or held
    if (o.referenced) {
      o.referenced = false;
      continue;
    }
    free_.push_back(s);
    key_of_slot_[s].reset();
    by_key_.erase(it);
    --evictable_;
    ++stats_.evictions;
    return true;
  }
}

Index::Reserve Index::reserve(const kv::ChunkKey& key, bool has_image, std::uint32_t* slot) {
  if (by_key_.contains(key)) return Reserve::exists;
  if (free_.empty() && !evict_one()) {
    ++stats_.refused_full;
    return Reserve::full;
  }
  Object o;
  o.slot = free_.back();
  o.has_image = has_image;
  free_.pop_back();
  *slot = o.slot;
  key_of_slot_[o.slot] = key;
  by_key_.emplace(key, o);
  return Reserve::reserved;
}

void Index::commit(const kv::ChunkKey& key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end() || it->second.committed) return;
  it->second.committed = true;
  it->second.referenced = false;
  if (it->second.readers == 0) ++evictable_;
}

void Index::abort(const kv::ChunkKey& key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end() || it->second.committed) return;
  free_.push_back(it->second.slot);
  key_of_slot_[it->second.slot].reset();
  by_key_.erase(it);
}

kv::HitSource Index::run(std::span<const kv::ChunkKey> keys, std::uint32_t chunk_tokens,
                         std::vector<std::uint32_t>* pinned) {
  kv::HitSource h;
  std::uint32_t n = 0;
  for (const kv::ChunkKey& k : keys) {
    auto it = by_key_.find(k);
    if (it == by_key_.end() || !it->second.committed) break;
    it->second.referenced = true;
    if (pinned) {
      add_reader(it->second);
      pinned->push_back(it->second.slot);
    }
    ++n;
    if (it->second.has_image) h.checkpoints.push_back(n * chunk_tokens);
  }
  h.tokens = n * chunk_tokens;
  stats_.lookup_hits += n;
  if (n < keys.size()) ++stats_.lookup_misses;
  return h;
}

kv::HitSource Index::lookup(std::span<const kv::ChunkKey> keys, std::uint32_t chunk_tokens) {
  return run(keys, chunk_tokens, nullptr);
}

std::optional<std::vector<std::uint32_t>> Index::pin(std::span<const kv::ChunkKey> keys) {
  std::vector<std::uint32_t> slots;
  for (const kv::ChunkKey& k : keys) {
    auto it = by_key_.find(k);
    if (it == by_key_.end() || !it->second.committed) return std::nullopt;
    slots.push_back(it->second.slot);
  }
  for (const kv::ChunkKey& k : keys) {
    Object& o = by_key_.find(k)->second;
    add_reader(o);
    o.referenced = true;
  }
  return slots;
}

void Index::unpin(std::span<const kv::ChunkKey> keys) {
  for (const kv::ChunkKey& k : keys)
    if (auto it = by_key_.find(k); it != by_key_.end()) drop_reader(it->second);
}

bool Index::has_image(const kv::ChunkKey& key) const {
  auto it = by_key_.find(key);
  return it != by_key_.end() && it->second.has_image;
}

// ---- holds ------------------------------------------------------------------------

Index::Lease Index::lease(std::span<const kv::ChunkKey> keys, std::uint32_t chunk_tokens, Owner owner) {
  Lease l;
  l.hit = run(keys, chunk_tokens, &l.slots);
  if (l.slots.empty()) return l;
  l.id = next_hold_++;
  holds_.emplace(l.id, Hold{owner, true, std::vector<kv::ChunkKey>(keys.begin(), keys.begin() + l.slots.size())});
  return l;
}

Index::Reservation Index::reserve(std::span<const kv::ChunkKey> keys, std::span<const bool> images, Owner owner) {
  Reservation r;
  r.chunks.resize(keys.size(), Chunk::full);
  r.slots.resize(keys.size(), 0);
  Hold h{owner, false, {}};
  for (std::size_t i = 0; i < keys.size(); ++i) {
    switch (reserve(keys[i], i < images.size() && images[i], &r.slots[i])) {
      case Reserve::reserved:
        r.chunks[i] = Chunk::reserved;
        ++r.reserved;
        h.keys.push_back(keys[i]);
        break;
      case Reserve::exists:
        r.chunks[i] = Chunk::existed;
        ++r.existed;
        break;
      case Reserve::full: ++r.full; break;
    }
  }
  if (!h.keys.empty()) {
    r.id = next_hold_++;
    holds_.emplace(r.id, std::move(h));
  }
  return r;
}

bool Index::commit(HoldId id, bool ok) {
  auto it = holds_.find(id);
  if (it == holds_.end() || it->second.lease) return false;
  for (const kv::ChunkKey& k : it->second.keys) ok ? commit(k) : abort(k);
  holds_.erase(it);
  return true;
}

bool Index::release(HoldId id) {
  auto it = holds_.find(id);
  if (it == holds_.end()) return false;
  if (it->second.lease) {
    unpin(it->second.keys);
  } else {
    for (const kv::ChunkKey& k : it->second.keys) abort(k);
  }
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
    const std::uint64_t bytes = h.keys.size() * object_bytes_;
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

bool Index::is_lease(HoldId id) const {
  auto it = holds_.find(id);
  return it != holds_.end() && it->second.lease;
}

std::map<HoldId, std::pair<Owner, bool>> Index::holds() const {
  std::map<HoldId, std::pair<Owner, bool>> out;
  for (const auto& [id, h] : holds_) out[id] = {h.owner, h.lease};
  return out;
}

Index::Stats Index::stats() const {
  Stats s = stats_;
  s.capacity_bytes = static_cast<std::uint64_t>(slots_) * object_bytes_;
  for (const auto& [k, o] : by_key_) {
    if (o.committed) {
      ++s.objects;
      if (o.readers) ++s.pinned;
    } else {
      ++s.writing;
    }
  }
  for (const auto& [id, h] : holds_) (h.lease ? s.leases : s.reservations) += 1;
  s.used_bytes = static_cast<std::uint64_t>(by_key_.size()) * object_bytes_;
  return s;
}

}  // namespace kvstrand::tier
