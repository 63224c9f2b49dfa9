#include "kv_pool.hpp"

#include <algorithm>
#include <stdexcept>

namespace kvstrand::engine {

KvPool::KvPool(const kv::Layout& layout, std::uint32_t blocks, std::uint32_t running_slots,
               std::uint32_t checkpoint_slots, bool cache_enabled)
    : layout_(layout), blocks_(blocks), cache_(cache_enabled), running_slots_(running_slots), refs_(blocks, 0),
      hash_of_(blocks), committed_as_(blocks) {
  for (const auto& p : layout.planes) planes_.push_back(DeviceMemory::allocate(p.bytes_per_block * blocks));
  state_.emplace(DeviceMemory::allocate(layout.checkpoint.image_bytes * (running_slots + checkpoint_slots)));
  for (kv::BlockId b = blocks; b-- > 0;) free_.push_back(b);
  for (std::int32_t s = static_cast<std::int32_t>(running_slots); s-- > 0;) running_free_.push_back(s);
  for (std::uint32_t i = checkpoint_slots; i-- > 0;)
    ckpt_free_.push_back(static_cast<std::int32_t>(running_slots + i));
}

Registration KvPool::registration() {
  Registration reg;
  reg.layout = layout_;
  for (auto& p : planes_) reg.planes.push_back({p.data(), blocks_});
  reg.state = {state_->data(),
               static_cast<std::uint32_t>(state_->size() / layout_.checkpoint.image_bytes)};
  return reg;
}

std::optional<std::vector<kv::BlockId>> KvPool::allocate(std::uint32_t n) {
  // A cached block nobody references may still be a save's source (its
  // hash's committed block, leased by the save): it is not reused until the
  // lease is released. Count what can go before taking anything.
  std::vector<kv::BlockId> victims;
  for (auto it = lru_.begin(); it != lru_.end() && free_.size() + victims.size() < n; ++it)
    if (!leases_.is_leased(*it)) victims.push_back(*it);
  if (free_.size() + victims.size() < n) return std::nullopt;
  std::vector<kv::BlockId> out;
  for (std::size_t v = 0; out.size() < n;) {
    kv::BlockId b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      b = victims[v++];
      evict(b);
    }
    refs_[b] = 1;
    out.push_back(b);
  }
  return out;
}

// `b` no longer holds what it was committed under (evicted, or back in the
// free list): a save must not read it for that hash. The block the cache
// holds under the same hash (same bytes) takes over, if there is one.
void KvPool::drop_committed(kv::BlockId b) {
  if (!committed_as_[b]) return;
  const kv::Digest h = *committed_as_[b];
  committed_as_[b].reset();
  if (committed_.committed(h) != b) return;
  if (auto it = by_hash_.find(h); it != by_hash_.end() && it->second != b) {
    committed_.commit(h, it->second);
    committed_as_[it->second] = h;
  } else {
    committed_.evict(h);
  }
}

void KvPool::evict(kv::BlockId b) {
  lru_.erase(lru_pos_.at(b));
  lru_pos_.erase(b);
  const kv::Digest h = *hash_of_[b];
  by_hash_.erase(h);
  drop_committed(b);
  hash_of_[b].reset();
  ++stats_.evictions;
  if (auto it = ckpt_.find(h); it != ckpt_.end()) {  // its checkpoint goes with it (unless a save reads it)
    const std::int32_t s = it->second;
    ckpt_.erase(it);
    ckpt_owner_.erase(s);
    ckpt_lru_.remove(s);
    if (!slot_pins_.contains(s)) ckpt_free_.push_back(s);
    else ckpt_free_later_.push_back(s);
  }
}

std::optional<kv::BlockId> KvPool::acquire_cached(const kv::Digest& hash) {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const kv::BlockId b = it->second;
  // Unreferenced, it is in the LRU, or still leased by a save (then the
  // lease's release finds it referenced again and leaves it be).
  if (refs_[b]++ == 0)
    if (auto pos = lru_pos_.find(b); pos != lru_pos_.end()) {
      lru_.erase(pos->second);
      lru_pos_.erase(pos);
    }
  return b;
}

void KvPool::commit(kv::BlockId block, const kv::Digest& hash) {
  committed_.commit(hash, block);  // the save source: this block holds it now (its request references it)
  committed_as_[block] = hash;
  if (!cache_ || by_hash_.contains(hash) || hash_of_[block]) return;
  by_hash_[hash] = block;
  hash_of_[block] = hash;
}

void KvPool::release(kv::BlockId b) {
  if (refs_[b] == 0) throw std::logic_error("KV pool: block released twice");
  if (--refs_[b] > 0) return;
  if (leases_.free(b)) to_pool(b);  // else a save still reads it: returned() brings it back
}

void KvPool::returned(const std::vector<kv::BlockId>& blocks) {
  for (kv::BlockId b : blocks)
    if (refs_[b] == 0) to_pool(b);
}

void KvPool::to_pool(kv::BlockId b) {
  if (hash_of_[b]) {  // cached: keeps its bytes (and stays a valid source) until evicted
    lru_.push_back(b);
    lru_pos_[b] = std::prev(lru_.end());
  } else {  // a duplicate of a cached block, or never committed: its bytes are up for reuse
    drop_committed(b);
    free_.push_back(b);
  }
}

std::optional<std::int32_t> KvPool::checkpoint_slot_for(const kv::Digest& hash) {
  if (!cache_) return std::nullopt;
  if (auto it = ckpt_.find(hash); it != ckpt_.end()) return it->second;
  for (auto it = ckpt_free_later_.begin(); it != ckpt_free_later_.end();) {
    if (!slot_pins_.contains(*it)) {
      ckpt_free_.push_back(*it);
      it = ckpt_free_later_.erase(it);
    } else {
      ++it;
    }
  }
  std::int32_t s = -1;
  if (!ckpt_free_.empty()) {
    s = ckpt_free_.back();
    ckpt_free_.pop_back();
  } else {
    auto victim = std::find_if(ckpt_lru_.begin(), ckpt_lru_.end(), [&](std::int32_t v) { return !slot_pins_.contains(v); });
    if (victim == ckpt_lru_.end()) return std::nullopt;
    s = *victim;
    ckpt_lru_.erase(victim);
    ckpt_.erase(ckpt_owner_.at(s));
    ++stats_.checkpoint_evictions;
  }
  ckpt_[hash] = s;
  ckpt_owner_[s] = hash;
  ckpt_lru_.push_back(s);
  return s;
}

std::optional<std::int32_t> KvPool::checkpoint(const kv::Digest& hash) const {
  auto it = ckpt_.find(hash);
  if (it == ckpt_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::int32_t> KvPool::take_running_slot() {
  if (running_free_.empty()) return std::nullopt;
  const std::int32_t s = running_free_.back();
  running_free_.pop_back();
  return s;
}

}  // namespace kvstrand::engine
