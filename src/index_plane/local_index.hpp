// The embedded index plane: a pinned host arena in the engine process, the
// same Index and size classes as kvstrand-server (one object per chunk, one
// index per object size over the arena's slabs, LRU eviction of objects no
// one holds). Under HostTier, which moves the bytes; all on the strand.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "device/pinned_buffer.hpp"
#include "index_plane/index_plane.hpp"
#include "tier/index.hpp"
#include "tier/size_classes.hpp"

namespace kvstrand::index_plane {

class LocalIndex : public IndexPlane {  // not final: tests' index doubles derive from it
 public:
  explicit LocalIndex(std::uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  boost::asio::awaitable<LookupResult> lookup(std::uint32_t registration, std::vector<kv::ChunkKey> keys) override;
  boost::asio::awaitable<Places> reserve(std::uint32_t registration, const std::vector<kv::ChunkKey>& keys,
                                         const std::vector<bool>& images, const std::vector<std::string>& events,
                                         Clock::time_point deadline) override;
  boost::asio::awaitable<Failure> commit(std::uint32_t registration, const std::vector<kv::ChunkKey>& keys,
                                         const Places& places, bool copied, Clock::time_point deadline) override;
  boost::asio::awaitable<Held> hold(const kv::TransferSpec& spec, Clock::time_point deadline) override;
  std::optional<Held> hold_now(const kv::TransferSpec& spec) override;
  void release(const kv::TransferSpec& spec, const Held& held) override;
  boost::asio::awaitable<Dropped> drop(std::uint32_t registration) override;
  std::shared_ptr<void> memory() const override { return arena_; }
  tier::Index::Stats stats() const override;
  const char* kind() const noexcept override { return "local"; }

  // The arena is cut into slabs, given to object sizes as they need room:
  // a sixteenth of the arena, at most this, never smaller than the first
  // registration's object. Later registrations' objects must fit one
  // (register the group with the largest objects first).
  static constexpr std::uint64_t kSlabBytes = 64ull << 20;

 protected:
  boost::asio::awaitable<Failure> attach_registration(std::uint32_t id) override;

 private:
  tier::Index* index_of(std::uint32_t registration) const { return indexes_.at(registration); }
  std::byte* object(const tier::Index& index, std::uint32_t slot) const {
    return arena_->data() + classes_->offset_of(index, slot);
  }

  std::uint64_t capacity_;
  std::vector<tier::Index*> indexes_;  // by registration id: its objects' size class
  std::shared_ptr<device::PinnedBuffer> arena_;
  std::optional<tier::SizeClasses> classes_;
};

}  // namespace kvstrand::index_plane
