// The embedded default tier: a pinned host arena in the engine process, the
// same Index as the node tier (one object per chunk, LRU eviction of objects
// no one holds), copies on the reactor's own streams through copy_and_wait. Saves (D2H) and loads
// (H2D) use separate streams, so a load never queues behind saves and the
// two directions overlap on a GPU's separate copy engines.
#pragma once

#include <memory>
#include <optional>

#include "hip/pinned_buffer.hpp"
#include "hip/stream.hpp"
#include "reactor/copy_and_wait.hpp"
#include "tier/index.hpp"
#include "reactor/reactor.hpp"
#include "reactor/tier.hpp"

namespace kvstrand::reactor {

class LocalTier final : public Tier {
 public:
  LocalTier(Reactor& reactor, std::uint64_t capacity_bytes);
  ~LocalTier() override;

  boost::asio::awaitable<std::error_code> attach(const Registration& reg) override;
  boost::asio::awaitable<LookupResult> lookup(std::vector<kv::ChunkKey> keys) override;
  boost::asio::awaitable<std::error_code> save(Transfer& t) override;
  boost::asio::awaitable<std::error_code> load(Transfer& t) override;
  tier::Index::Stats stats() const override;
  const char* kind() const noexcept override { return "local"; }
  boost::asio::awaitable<void> drain() override { co_return; }

  tier::Index& index() { return *index_; }
  bool attached() const noexcept { return index_.has_value(); }

  // The streams the tier copies on (tests hold them with the sim hooks).
  hip::Stream& save_stream() { return *save_stream_; }
  hip::Stream& load_stream() { return *load_stream_; }

 private:
  std::byte* object(std::uint32_t slot) const { return arena_->data() + slot * object_bytes_; }

  Reactor& reactor_;
  std::uint64_t capacity_;
  const Registration* reg_ = nullptr;
  std::uint64_t object_bytes_ = 0;
  std::optional<hip::Stream> save_stream_;
  std::optional<hip::Stream> load_stream_;
  std::optional<hip::PinnedBuffer> arena_;
  std::optional<tier::Index> index_;
};

}  // namespace kvstrand::reactor
