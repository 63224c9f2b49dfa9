// The queue of committed objects a level below the arena writes behind
// (the disk, L2). Each is read-locked in the index from the commit that queued
// it until the level has taken its bytes (or it is dropped), so eviction
// cannot free or reuse its slot meanwhile. Bounded in objects and in bytes
// (the bytes of those queued and of those taken but not yet done): what
// does not fit is refused at once, never waited for; a commit's reply
// never waits on a level below. With --events, each item holds its
// object's whole description (the level's BlockStored needs it, and the
// arena's slot keeps only a part once the commit is announced). One strand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>

#include "server/events/description_pool.hpp"
#include "tier/index.hpp"

namespace kvstrand::server {

class WriteBehind {
 public:
  struct Item {
    tier::Index* index;  // the arena's size class it is in
    kv::ChunkKey key;
    std::uint32_t slot;
    bool image;
    DescriptionPool::Id description = DescriptionPool::kNone;  // held by the item
  };
  enum class Push { queued, full, not_committed };

  WriteBehind(std::size_t max_objects, std::uint64_t max_bytes) : max_objects_(max_objects), max_bytes_(max_bytes) {}
  WriteBehind(const WriteBehind&) = delete;
  WriteBehind& operator=(const WriteBehind&) = delete;

  // Where the items' descriptions are held (with --events).
  void set_descriptions(std::shared_ptr<DescriptionPool> pool) { pool_ = std::move(pool); }

  // Queues `slot` of `index`, read-locked, with `description` (held for it,
  // given back at its done, or at once where it is not queued); full: past
  // a bound, nothing locked.
  Push push(tier::Index& index, std::uint32_t slot, DescriptionPool::Id description = DescriptionPool::kNone) {
    const Push p = queue(index, slot, description);
    if (p != Push::queued && pool_) pool_->release(description);
    return p;
  }

  bool empty() const noexcept { return items_.empty(); }
  std::size_t size() const noexcept { return items_.size(); }
  // Queued and taken but not done: what the byte bound counts.
  std::uint64_t bytes() const noexcept { return bytes_; }
  const std::deque<Item>& items() const noexcept { return items_; }

  // The oldest, off the queue: still read-locked and counted until done(it).
  Item take() {
    Item it = items_.front();
    items_.pop_front();
    return it;
  }
  // A taken item's write ended (or was given up): unlocked, uncounted, its
  // description given back.
  void done(const Item& it) {
    it.index->read_unlock(it.key);
    bytes_ -= it.index->object_bytes();
    if (pool_) pool_->release(it.description);
  }

  // Every queued object of namespace `ns` off the queue, unlocked (a drop:
  // none of them is written). How many.
  std::size_t drop_namespace(const kv::Digest& ns) {
    return std::erase_if(items_, [&](const Item& it) {
      if (it.key.ns != ns) return false;
      done(it);
      return true;
    });
  }
  // Everything queued off the queue, unlocked (a close).
  void clear() {
    for (const Item& it : items_) done(it);
    items_.clear();
  }

 private:
  Push queue(tier::Index& index, std::uint32_t slot, DescriptionPool::Id description) {
    if (items_.size() >= max_objects_ || bytes_ + index.object_bytes() > max_bytes_) return Push::full;
    const kv::ChunkKey& key = index.key_at(slot);
    if (!index.read_lock(key)) return Push::not_committed;
    items_.push_back(Item{&index, key, slot, index.image_at(slot), description});
    bytes_ += index.object_bytes();
    return Push::queued;
  }

  std::shared_ptr<DescriptionPool> pool_;
  std::size_t max_objects_;
  std::uint64_t max_bytes_;
  std::deque<Item> items_;
  std::uint64_t bytes_ = 0;
};

}  // namespace kvstrand::server
