// The queue of committed objects a level below the arena writes behind
// (the disk, L2). Each is read-locked in the index from the commit that queued
// it until the level has taken its bytes (or it is dropped), so eviction
// cannot free or reuse its slot meanwhile. Bounded in objects and in bytes
// (the bytes of those queued and of those taken but not yet done): what
// does not fit is refused at once, never waited for; a commit's reply
// never waits on a level below. One strand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>

#include "tier/index.hpp"

namespace kvstrand::server {

class WriteBehind {
 public:
  struct Item {
    tier::Index* index;  // the arena's size class it is in
    kv::ChunkKey key;
    std::uint32_t slot;
    bool image;
  };
  enum class Push { queued, full, not_committed };

  WriteBehind(std::size_t max_objects, std::uint64_t max_bytes) : max_objects_(max_objects), max_bytes_(max_bytes) {}
  WriteBehind(const WriteBehind&) = delete;
  WriteBehind& operator=(const WriteBehind&) = delete;

  // Queues `slot` of `index`, read-locked; full: past a bound, nothing locked.
  Push push(tier::Index& index, std::uint32_t slot) {
    if (items_.size() >= max_objects_ || bytes_ + index.object_bytes() > max_bytes_) return Push::full;
    const kv::ChunkKey& key = index.key_at(slot);
    if (!index.read_lock(key)) return Push::not_committed;
    items_.push_back(Item{&index, key, slot, index.image_at(slot)});
    bytes_ += index.object_bytes();
    return Push::queued;
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
  // A taken item's write ended (or was given up): unlocked, uncounted.
  void done(const Item& it) {
    it.index->read_unlock(it.key);
    bytes_ -= it.index->object_bytes();
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
  std::size_t max_objects_;
  std::uint64_t max_bytes_;
  std::deque<Item> items_;
  std::uint64_t bytes_ = 0;
};

}  // namespace kvstrand::server
