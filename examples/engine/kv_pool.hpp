// The engine's device memory: a paged KV pool (one buffer per plane), an HBM
// prefix cache over it, and state slots (one per running request, the rest
// holding checkpoint images of cached chunk ends).
//
// - A block is referenced by the requests whose block tables hold it. At no
//   references a block committed under a hash stays cached (LRU, evictable);
//   one without a hash goes straight back to the free list.
// - A block whose last reference is dropped while a save still reads it
//   (BlockLeases) returns to the pool only when the lease is released; a
//   cached block a save leases while nobody references it is not evicted.
// - The save source of a hash (CommittedBlocks) is always a block that still
//   holds it: a block that leaves the cache, or goes back to the free list,
//   hands the role to the cached block of the same hash or drops it.
// - Every chunk end the cache holds may keep its checkpoint image in a slot,
//   so a local hit resumes from HBM alone. A slot an in-flight save reads is
//   pinned; evicting a block drops its checkpoint.
#pragma once

#include <list>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include <kvstrand/device_memory.hpp>
#include <kvstrand/block_leases.hpp>
#include <kvstrand/committed_blocks.hpp>
#include <kvstrand/digest.hpp>
#include <kvstrand/layout.hpp>
#include <kvstrand/registration.hpp>

namespace kvstrand::engine {

class KvPool {
 public:
  KvPool(const kv::Layout& layout, std::uint32_t blocks, std::uint32_t running_slots, std::uint32_t checkpoint_slots,
         bool cache_enabled);

  Registration registration();
  const kv::Layout& layout() const { return layout_; }
  // Plane p's memory (block b at b x its bytes per block), and the state
  // memory (slot s at slot_offset(s)).
  DeviceMemory& plane(std::size_t p) { return planes_[p]; }
  DeviceMemory& state() { return *state_; }
  std::uint64_t slot_offset(std::int32_t s) const {
    return static_cast<std::uint64_t>(s) * layout_.checkpoint.image_bytes;
  }
  std::uint32_t blocks() const { return blocks_; }

  // ---- blocks ----
  // `n` fresh blocks (referenced once), evicting cached ones LRU; none if
  // the pool cannot supply them (nothing is taken then).
  std::optional<std::vector<kv::BlockId>> allocate(std::uint32_t n);
  // The block cached under `hash`, referenced once more; none on a miss.
  std::optional<kv::BlockId> acquire_cached(const kv::Digest& hash);
  bool cached(const kv::Digest& hash) const { return by_hash_.contains(hash); }
  // `block` now holds the KV of `hash` (computed or landed). A hash already
  // cached in another block leaves this one uncached.
  void commit(kv::BlockId block, const kv::Digest& hash);
  void release(kv::BlockId block);
  kv::BlockLeases& leases() { return leases_; }
  kv::CommittedBlocks& committed() { return committed_; }
  // Blocks a released lease gave back.
  void returned(const std::vector<kv::BlockId>& blocks);

  // ---- checkpoints of cached chunk ends ----
  // A slot for the image at the end of the block `hash` (the chunk's last
  // block), reusing the LRU unpinned one; none if all are pinned.
  std::optional<std::int32_t> checkpoint_slot_for(const kv::Digest& hash);
  std::optional<std::int32_t> checkpoint(const kv::Digest& hash) const;
  void pin_slot(std::int32_t s) { ++slot_pins_[s]; }
  void unpin_slot(std::int32_t s) {
    if (--slot_pins_[s] == 0) slot_pins_.erase(s);
  }

  // ---- running slots ----
  std::optional<std::int32_t> take_running_slot();
  void free_running_slot(std::int32_t s) { running_free_.push_back(s); }

  struct Stats {
    std::uint64_t evictions = 0, checkpoint_evictions = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  void evict(kv::BlockId b);
  void drop_committed(kv::BlockId b);
  void to_pool(kv::BlockId b);

  kv::Layout layout_;
  std::uint32_t blocks_;
  bool cache_;
  std::vector<DeviceMemory> planes_;
  std::optional<DeviceMemory> state_;
  std::uint32_t running_slots_;
  std::vector<std::uint32_t> refs_;
  std::vector<std::optional<kv::Digest>> hash_of_;        // cached under (by_hash_)
  std::vector<std::optional<kv::Digest>> committed_as_;   // the save source of (committed_)
  std::map<kv::Digest, kv::BlockId> by_hash_;
  std::list<kv::BlockId> lru_;  // cached, unreferenced; front = least recent
  std::unordered_map<kv::BlockId, std::list<kv::BlockId>::iterator> lru_pos_;
  std::vector<kv::BlockId> free_;
  kv::BlockLeases leases_;
  kv::CommittedBlocks committed_;
  // checkpoint slots: [running_slots_, running_slots_ + checkpoint_slots)
  std::map<kv::Digest, std::int32_t> ckpt_;
  std::list<std::int32_t> ckpt_lru_;  // assigned slots; front = least recent
  std::map<std::int32_t, kv::Digest> ckpt_owner_;
  std::vector<std::int32_t> ckpt_free_;
  std::vector<std::int32_t> ckpt_free_later_;  // dropped while a save read them
  std::map<std::int32_t, std::uint32_t> slot_pins_;
  std::vector<std::int32_t> running_free_;
  Stats stats_;
};

}  // namespace kvstrand::engine
