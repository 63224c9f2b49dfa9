// What the server's KV events say about its objects (--events): each
// object's description, as the engine sent it with the reserve (protocol
// 2.4), kept by slot for every index it watches (the arena's classes,
// medium "CPU" or "CPU_PINNED"; the disk's, "STORAGE" or "DISK": see
// --events-medium-names). A described object is announced stored when its index commits it, and removed when it leaves (evicted,
// dropped, refused by its checksum); an object with no description (an
// older client, or one that sent none) is never announced.
//
// Descriptions move with their objects: the disk takes an arena object's
// when it writes it (and keeps it in the object's header block, so a
// restart finds it), the arena a disk object's when it reads it back.
// A server's first batch is AllBlocksCleared, then every described object
// it found at its start (announce_recovered).
//
// A description is held whole only while something may still need all of
// it: the slot until its BlockStored went out, a level below (the disk,
// L2) until it has written the object behind. Then the slot keeps only
// what BlockRemoved says (keep_removal_only: the block hashes, a tenth of
// a 256-token chunk's description); a disk object's whole one stays in
// its header block, where a promotion reads it back.
//
// On the server's strand. Memory: 4 B and two bits a slot of every
// watched index, and each distinct description once (DescriptionPool),
// however many objects hold it (an arena object and its disk copy share
// one).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <kvstrand/chunk_keys.hpp>
#include "server/events/description_pool.hpp"
#include "server/events/event_publisher.hpp"
#include "tier/index.hpp"
#include "tier/size_classes.hpp"

namespace kvstrand::server {

class TierEvents {
 public:
  explicit TierEvents(std::shared_ptr<EventPublisher> publisher);
  ~TierEvents();
  TierEvents(const TierEvents&) = delete;
  TierEvents& operator=(const TierEvents&) = delete;

  // Every index of `classes`, made now or later, on `medium`.
  void watch(tier::SizeClasses& classes, std::string medium);
  // Slot `slot` of `index`, just reserved, is described (before its commit).
  void describe(const tier::Index& index, std::uint32_t slot, std::string_view description);
  // The same, with a description held already (hold_whole's): held once
  // more for the slot.
  void describe(const tier::Index& index, std::uint32_t slot, DescriptionPool::Id held);
  // The description of `slot` of `index` (whole, or BlockRemoved's part
  // once kept alone); empty when it has none.
  std::string_view description(const tier::Index& index, std::uint32_t slot) const;
  // The whole description of `slot` of `index`, held once more for a level
  // that writes the object behind (its BlockStored there needs all of it);
  // kNone where the slot has none whole. Given back with release().
  DescriptionPool::Id hold_whole(const tier::Index& index, std::uint32_t slot);
  void release(DescriptionPool::Id id) noexcept { pool_->release(id); }
  std::string_view text(DescriptionPool::Id id) const noexcept { return pool_->at(id); }
  // Once the commits of `slots` were announced and the levels below took
  // what they write behind: each keeps only BlockRemoved's part of its
  // description.
  void keep_removal_only(const tier::Index& index, std::span<const std::uint32_t> slots);
  // The whole description of `from_slot`, where it has one, for `to_slot`.
  void copy(const tier::Index& from, std::uint32_t from_slot, const tier::Index& to, std::uint32_t to_slot);
  // The first batch: AllBlocksCleared, then, for every readable object of
  // every watched index whose key `found` describes, BlockStored (and the
  // object keeps its description).
  void announce_recovered(const std::unordered_map<kv::ChunkKey, std::string, tier::ChunkKeyHash>& found);

  EventPublisher& publisher() noexcept { return *publisher_; }
  const EventPublisher& publisher() const noexcept { return *publisher_; }
  std::uint64_t refused() const noexcept { return refused_; }
  // The descriptions held, and their bytes (/metrics).
  const DescriptionPool& descriptions() const noexcept { return *pool_; }
  // Shared with the write-behind queues, whose items hold descriptions
  // (and may outlive this, at a server's end).
  const std::shared_ptr<DescriptionPool>& shared_descriptions() const noexcept { return pool_; }
  void count_refused() noexcept { ++refused_; }

 private:
  struct Watched;
  Watched* of(const tier::Index& index) const;

  std::shared_ptr<EventPublisher> publisher_;
  std::shared_ptr<DescriptionPool> pool_;  // before watched_: what they hold is released into it
  std::map<const tier::Index*, std::unique_ptr<Watched>> watched_;
  std::vector<std::unique_ptr<std::string>> media_;
  std::uint64_t refused_ = 0;
};

}  // namespace kvstrand::server
