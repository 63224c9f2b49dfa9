#include "reactor/local_tier.hpp"

#include <spdlog/spdlog.h>

#include "reactor/transfer_error.hpp"

namespace kvstrand::reactor {

LocalTier::LocalTier(Reactor& reactor, std::uint64_t capacity_bytes) : reactor_(reactor), capacity_(capacity_bytes) {}

LocalTier::~LocalTier() {
  // A copy still queued would touch the arena after it is freed.
  if (save_stream_) (void)save_stream_->synchronize();
  if (load_stream_) (void)load_stream_->synchronize();
}

boost::asio::awaitable<std::error_code> LocalTier::attach(const Registration& reg) { co_return attach_now(reg); }

std::error_code LocalTier::attach_now(const Registration& reg) {
  if (store_) {
    if (reg.object_bytes() != object_bytes_) {
      spdlog::error("kvstrand: a layout with {}-byte objects cannot share a tier of {}-byte objects",
                    reg.object_bytes(), object_bytes_);
      return TransferErrc::bad_spec;
    }
    reg_ = &reg;
    return {};
  }
  reg_ = &reg;
  object_bytes_ = reg.object_bytes();
  const std::uint64_t slots = object_bytes_ == 0 ? 0 : capacity_ / object_bytes_;
  if (slots == 0) {
    spdlog::error("kvstrand: tier_bytes {} cannot hold one object of {} bytes", capacity_, object_bytes_);
    return TransferErrc::tier_full;
  }
  auto saves = hip::Stream::create();
  auto loads = hip::Stream::create();
  auto arena = hip::PinnedBuffer::allocate(slots * object_bytes_);
  for (const hip::Status& s : {saves.status(), loads.status(), arena.status()}) {
    if (s.ok()) continue;
    spdlog::error("kvstrand: LocalTier: {}", s.describe());
    return TransferErrc::device_error;
  }
  save_stream_.emplace(std::move(saves).value());
  load_stream_.emplace(std::move(loads).value());
  arena_.emplace(std::move(arena).value());
  store_.emplace(slots * object_bytes_, object_bytes_);
  return {};
}

boost::asio::awaitable<kv::HitSource> LocalTier::lookup(std::vector<kv::ChunkKey> keys) {
  if (!store_) co_return kv::HitSource{};
  co_return lookup(keys, reg_->layout.chunk_tokens);
}

kv::HitSource LocalTier::lookup(std::span<const kv::ChunkKey> keys, std::uint32_t chunk_tokens) {
  if (!store_) return {};
  return store_->lookup(keys, chunk_tokens);
}

boost::asio::awaitable<std::error_code> LocalTier::save(Transfer& t) { return save(*reg_, t); }
boost::asio::awaitable<std::error_code> LocalTier::load(Transfer& t) { return load(*reg_, t); }

boost::asio::awaitable<std::error_code> LocalTier::copy(Transfer& t, hip::Stream& stream, hip::CopyKind kind,
                                                        std::vector<hip::Segment> segs, bool* copied) {
  *copied = true;
  if (hip::Status s = hip::copy_batch(stream, kind, segs); !s.ok()) {
    t.reason = s.describe();
    co_return TransferErrc::device_error;
  }
  auto lease = reactor_.events().acquire();
  if (!lease.ok() || !lease->record(stream).ok()) {
    // The copy is queued but cannot be awaited: wait it out on the stream's
    // terms by synchronising, which only a broken runtime ever gets here for.
    (void)stream.synchronize();
    t.reason = lease.ok() ? "event record failed" : lease.status().describe();
    co_return TransferErrc::device_error;
  }
  t.state = TransferState::pending;
  std::error_code ec = co_await reactor_.poller().ready(lease->event());
  if (ec == std::errc::operation_canceled) {
    *copied = false;  // shutdown: the copy may still be running
    t.reason = "reactor shut down before the copy was seen complete";
    co_return ec;
  }
  if (ec) {
    t.reason = "device: " + ec.message();
    co_return TransferErrc::device_error;
  }
  co_return std::error_code{};
}

boost::asio::awaitable<std::error_code> LocalTier::save(const Registration& reg, Transfer& t) {
  const kv::TransferSpec& s = t.spec;
  std::vector<std::byte*> objects(s.keys.size(), nullptr);
  std::vector<bool> images(s.keys.size(), false);
  std::vector<kv::ChunkKey> reserved;
  std::size_t refused = 0;
  for (std::size_t i = 0; i < s.keys.size(); ++i) {
    const bool image = s.with_state && s.state_slots[i] >= 0;
    std::uint32_t slot = 0;
    switch (store_->reserve(s.keys[i], image, &slot)) {
      case kv::ObjectStore::Reserve::reserved:
        objects[i] = object(slot);
        images[i] = image;
        reserved.push_back(s.keys[i]);
        break;
      case kv::ObjectStore::Reserve::exists: ++t.chunks_existed; break;  // never rewritten
      case kv::ObjectStore::Reserve::full: ++refused; break;
    }
  }
  std::error_code ec;
  if (!reserved.empty()) {
    bool copied = true;
    ec = co_await copy(t, *save_stream_, hip::CopyKind::device_to_host, reg.segments(s, objects, true, images), &copied);
    if (!copied) co_return ec;  // slots stay reserved: the copy may still write them
    for (const kv::ChunkKey& k : reserved) {
      if (ec) {
        store_->abort(k);
      } else {
        store_->commit(k);
      }
    }
  }
  t.chunks_refused = static_cast<std::uint32_t>(refused);
  if (!ec && refused > 0) {
    t.reason = std::to_string(refused) + " of " + std::to_string(s.keys.size()) +
               " chunks refused: every object is in use (tier full)";
    ec = TransferErrc::tier_full;
  }
  co_return ec;
}

boost::asio::awaitable<std::error_code> LocalTier::load(const Registration& reg, Transfer& t) {
  const kv::TransferSpec& s = t.spec;
  auto slots = store_->pin(s.keys);
  if (!slots) {
    t.reason = "the tier no longer holds every chunk of the load";
    co_return TransferErrc::missing_chunk;
  }
  if (s.with_state && !store_->has_image(s.keys.back())) {
    store_->unpin(s.keys);
    t.reason = "no checkpoint image stored at the load's end";
    co_return TransferErrc::missing_chunk;
  }
  std::vector<std::byte*> objects;
  for (std::uint32_t slot : *slots) objects.push_back(object(slot));
  std::vector<bool> images(objects.size(), false);
  if (s.with_state) images.back() = true;
  bool copied = true;
  std::error_code ec = co_await copy(t, *load_stream_, hip::CopyKind::host_to_device, reg.segments(s, objects, false, images),
                                     &copied);
  // Read locks go only once the copies out of the objects completed.
  if (copied) store_->unpin(s.keys);
  co_return ec;
}

kv::ObjectStore::Stats LocalTier::stats() const { return store_ ? store_->stats() : kv::ObjectStore::Stats{}; }

}  // namespace kvstrand::reactor
