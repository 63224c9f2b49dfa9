// The embedded default tier: a pinned host arena in the engine process, one
// object per chunk, LRU eviction of objects no one is reading, copies on the
// reactor's own streams with the batched segment copy. Saves (D2H) and loads
// (H2D) use separate streams, so a load never queues behind saves and the
// two directions overlap on a GPU's separate copy engines.
#pragma once

#include <memory>
#include <optional>

#include "hip/pinned_buffer.hpp"
#include "hip/stream.hpp"
#include "kv/object_store.hpp"
#include "reactor/reactor.hpp"
#include "reactor/tier.hpp"

namespace kvstrand::reactor {

class LocalTier final : public Tier {
 public:
  LocalTier(Reactor& reactor, std::uint64_t capacity_bytes);
  ~LocalTier() override;

  boost::asio::awaitable<std::error_code> attach(const Registration& reg) override;
  boost::asio::awaitable<kv::HitSource> lookup(std::vector<kv::ChunkKey> keys) override;
  boost::asio::awaitable<std::error_code> save(Transfer& t) override;
  boost::asio::awaitable<std::error_code> load(Transfer& t) override;
  kv::ObjectStore::Stats stats() const override;
  const char* kind() const noexcept override { return "local"; }
  boost::asio::awaitable<void> drain() override { co_return; }

  // For a tier shared by several registrations (kvstrand-server): the same
  // operations against a given registration. Every registration attached
  // must have the first one's object size.
  std::error_code attach_now(const Registration& reg);
  boost::asio::awaitable<std::error_code> save(const Registration& reg, Transfer& t);
  boost::asio::awaitable<std::error_code> load(const Registration& reg, Transfer& t);
  kv::HitSource lookup(std::span<const kv::ChunkKey> keys, std::uint32_t chunk_tokens);
  kv::ObjectStore& store() { return *store_; }
  bool attached() const noexcept { return store_.has_value(); }

  // The streams the tier copies on (tests hold them with the sim hooks).
  hip::Stream& save_stream() { return *save_stream_; }
  hip::Stream& load_stream() { return *load_stream_; }

 private:
  std::byte* object(std::uint32_t slot) const { return arena_->data() + slot * object_bytes_; }
  // Queues the segments and awaits their event. `copied` is false when the
  // wait ended without the copy being known complete (shutdown): the caller
  // must then leave every buffer it references alone.
  boost::asio::awaitable<std::error_code> copy(Transfer& t, hip::Stream& stream, hip::CopyKind kind,
                                               std::vector<hip::Segment> segs, bool* copied);

  Reactor& reactor_;
  std::uint64_t capacity_;
  const Registration* reg_ = nullptr;
  std::uint64_t object_bytes_ = 0;
  std::optional<hip::Stream> save_stream_;
  std::optional<hip::Stream> load_stream_;
  std::optional<hip::PinnedBuffer> arena_;
  std::optional<kv::ObjectStore> store_;
};

}  // namespace kvstrand::reactor
