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
// On the server's strand. Memory: 4 B and a bit a slot of every watched
// index, and each distinct description once (DescriptionPool), however
// many objects hold it (an arena object and its disk copy share one).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <kvstrand/chunk_keys.hpp>
#include "server/description_pool.hpp"
#include "server/event_publisher.hpp"
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
  // The description of `slot` of `index`; empty when it has none.
  std::string_view description(const tier::Index& index, std::uint32_t slot) const;
  void copy(const tier::Index& from, std::uint32_t from_slot, const tier::Index& to, std::uint32_t to_slot);
  // The first batch: AllBlocksCleared, then, for every readable object of
  // every watched index whose key `found` describes, BlockStored (and the
  // object keeps its description).
  void announce_recovered(const std::unordered_map<kv::ChunkKey, std::string, tier::ChunkKeyHash>& found);

  EventPublisher& publisher() noexcept { return *publisher_; }
  const EventPublisher& publisher() const noexcept { return *publisher_; }
  std::uint64_t refused() const noexcept { return refused_; }
  // The descriptions held, and their bytes (/metrics).
  const DescriptionPool& descriptions() const noexcept { return pool_; }
  void count_refused() noexcept { ++refused_; }

 private:
  struct Watched;
  Watched* of(const tier::Index& index) const;

  std::shared_ptr<EventPublisher> publisher_;
  DescriptionPool pool_;  // before watched_: what they hold is released into it
  std::map<const tier::Index*, std::unique_ptr<Watched>> watched_;
  std::vector<std::unique_ptr<std::string>> media_;
  std::uint64_t refused_ = 0;
};

}  // namespace kvstrand::server
