#include "kv/object_store.hpp"

namespace kvstrand::kv {

ObjectStore::ObjectStore(std::uint64_t capacity_bytes, std::uint64_t object_bytes)
    : object_bytes_(object_bytes), capacity_bytes_(capacity_bytes) {
  const std::uint64_t n = object_bytes == 0 ? 0 : capacity_bytes / object_bytes;
  for (std::uint64_t i = n; i > 0; --i) free_.push_back(static_cast<std::uint32_t>(i - 1));
}

bool ObjectStore::evict_one() {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    auto o = by_key_.find(*it);
    if (o->second.readers != 0) continue;  // an in-flight copy reads it
    free_.push_back(o->second.slot);
    by_key_.erase(o);
    lru_.erase(it);
    ++stats_.evictions;
    return true;
  }
  return false;
}

ObjectStore::Reserve ObjectStore::reserve(const ChunkKey& key, bool has_image, std::uint32_t* slot) {
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
  by_key_.emplace(key, o);
  return Reserve::reserved;
}

void ObjectStore::commit(const ChunkKey& key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end() || it->second.committed) return;
  it->second.committed = true;
  it->second.lru = lru_.insert(lru_.end(), key);
}

void ObjectStore::abort(const ChunkKey& key) {
  auto it = by_key_.find(key);
  if (it == by_key_.end() || it->second.committed) return;
  free_.push_back(it->second.slot);
  by_key_.erase(it);
}

void ObjectStore::touch(Object& o, const ChunkKey& key) {
  lru_.erase(o.lru);
  o.lru = lru_.insert(lru_.end(), key);
}

HitSource ObjectStore::lookup(std::span<const ChunkKey> keys, std::uint32_t chunk_tokens) {
  HitSource h;
  std::uint32_t n = 0;
  for (const ChunkKey& k : keys) {
    auto it = by_key_.find(k);
    if (it == by_key_.end() || !it->second.committed) break;
    touch(it->second, k);
    ++n;
    if (it->second.has_image) h.checkpoints.push_back(n * chunk_tokens);
  }
  h.tokens = n * chunk_tokens;
  stats_.lookup_hits += n;
  if (n < keys.size()) ++stats_.lookup_misses;
  return h;
}

std::optional<std::vector<std::uint32_t>> ObjectStore::pin(std::span<const ChunkKey> keys) {
  std::vector<std::uint32_t> slots;
  for (const ChunkKey& k : keys) {
    auto it = by_key_.find(k);
    if (it == by_key_.end() || !it->second.committed) return std::nullopt;
    slots.push_back(it->second.slot);
  }
  for (const ChunkKey& k : keys) {
    Object& o = by_key_.find(k)->second;
    ++o.readers;
    touch(o, k);
  }
  return slots;
}

void ObjectStore::unpin(std::span<const ChunkKey> keys) {
  for (const ChunkKey& k : keys) {
    auto it = by_key_.find(k);
    if (it != by_key_.end() && it->second.readers > 0) --it->second.readers;
  }
}

bool ObjectStore::has_image(const ChunkKey& key) const {
  auto it = by_key_.find(key);
  return it != by_key_.end() && it->second.has_image;
}

ObjectStore::Stats ObjectStore::stats() const {
  Stats s = stats_;
  s.capacity_bytes = capacity_bytes_;
  for (const auto& [k, o] : by_key_) {
    if (o.committed) {
      ++s.objects;
      if (o.readers) ++s.pinned;
    } else {
      ++s.writing;
    }
  }
  s.used_bytes = static_cast<std::uint64_t>(by_key_.size()) * object_bytes_;
  return s;
}

}  // namespace kvstrand::kv
