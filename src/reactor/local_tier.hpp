// The embedded default tier: a pinned host arena in the engine process, the
// same Index and size classes as the node tier (one object per chunk, one
// index per object size over the arena's slabs, LRU eviction of objects no
// one holds), copies on the reactor's own streams through copy_and_wait. Saves (D2H) and loads
// (H2D) use separate streams, so a load never queues behind saves and the
// two directions overlap on a GPU's separate copy engines.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "hip/pinned_buffer.hpp"
#include "hip/stream.hpp"
#include "reactor/copy_and_wait.hpp"
#include "tier/index.hpp"
#include "tier/size_classes.hpp"
#include "reactor/reactor.hpp"
#include "reactor/tier.hpp"

namespace kvstrand::reactor {

class LocalTier final : public Tier {
 public:
  LocalTier(Reactor& reactor, std::uint64_t capacity_bytes);
  ~LocalTier() override;

  boost::asio::awaitable<Refusal> attach(const Registration& reg) override;
  boost::asio::awaitable<LookupResult> lookup(std::uint32_t registration, std::vector<kv::ChunkKey> keys) override;
  boost::asio::awaitable<std::error_code> save(Transfer& t) override;
  boost::asio::awaitable<std::error_code> load(Transfer& t) override;
  tier::Index::Stats stats() const override;
  const char* kind() const noexcept override { return "local"; }
  boost::asio::awaitable<void> drain() override { co_return; }

  // The arena is cut into slabs, given to object sizes as they need room:
  // a sixteenth of the arena, at most this, never smaller than the first
  // registration's object. Later registrations' objects must fit one
  // (register the group with the largest objects first).
  static constexpr std::uint64_t kSlabBytes = 64ull << 20;

  // The streams the tier copies on (tests hold them with the sim hooks).
  hip::Stream& save_stream() { return *save_stream_; }
  hip::Stream& load_stream() { return *load_stream_; }

 private:
  struct Attached {
    const Registration* reg = nullptr;
    tier::Index* index = nullptr;  // its objects' size class
  };
  std::byte* object(const tier::Index& index, std::uint32_t slot) const {
    return arena_->data() + classes_->offset_of(index, slot);
  }

  Reactor& reactor_;
  std::uint64_t capacity_;
  std::vector<Attached> regs_;  // by registration id
  std::optional<hip::Stream> save_stream_;
  std::optional<hip::Stream> load_stream_;
  std::optional<hip::PinnedBuffer> arena_;
  std::optional<tier::SizeClasses> classes_;
};

}  // namespace kvstrand::reactor
