#include "reactor/local_tier.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "reactor/transfer_error.hpp"

namespace kvstrand::reactor {

LocalTier::LocalTier(Reactor& reactor, std::uint64_t capacity_bytes) : reactor_(reactor), capacity_(capacity_bytes) {}

LocalTier::~LocalTier() {
  // Only a copy never seen to end (a deadline fail-stop, a close that gave
  // up on it) can still be queued here. Waiting for it could be forever and
  // freeing under it would let it write freed memory: the streams and the
  // arena it may touch are left alive on purpose instead, and said so.
  const auto busy = [](std::optional<hip::Stream>& s) {
    return s && s->query().code() == hip::Errc::not_ready;
  };
  if (busy(save_stream_) || busy(load_stream_)) {
    spdlog::warn("kvstrand: LocalTier: a copy on its streams never ended; its {} B arena and its streams are left "
                 "allocated on purpose",
                 arena_ ? arena_->size() : 0);
    static auto* forever = new std::vector<std::tuple<hip::Stream, hip::Stream, hip::PinnedBuffer>>;
    forever->emplace_back(std::move(*save_stream_), std::move(*load_stream_), std::move(*arena_));
  }
}

boost::asio::awaitable<Refusal> LocalTier::attach(const Registration& reg) {
  const std::uint64_t object_bytes = reg.object_bytes();
  if (!arena_) {
    // At least 16 slabs where objects allow (room for other registrations'
    // sizes), at most kSlabBytes each, never smaller than this object.
    const std::uint64_t slab = std::min(capacity_, std::max(object_bytes, std::min(kSlabBytes, capacity_ / 16)));
    const std::uint64_t slabs = slab == 0 ? 0 : capacity_ / slab;
    if (slabs == 0 || object_bytes > slab)
      co_return Refusal{TransferErrc::tier_full, "tier_bytes " + std::to_string(capacity_) +
                                                     " cannot hold one object of " + std::to_string(object_bytes) +
                                                     " bytes"};
    auto saves = hip::Stream::create();
    auto loads = hip::Stream::create();
    auto arena = hip::PinnedBuffer::allocate(slabs * slab);
    for (const hip::Status& s : {saves.status(), loads.status(), arena.status()})
      if (!s.ok()) co_return Refusal{TransferErrc::device_error, "the embedded tier's streams or arena: " + s.describe()};
    save_stream_.emplace(std::move(saves).value());
    load_stream_.emplace(std::move(loads).value());
    arena_.emplace(std::move(arena).value());
    classes_.emplace(slab);
    for (std::uint64_t i = 0; i < slabs; ++i) classes_->add_slab(static_cast<std::uint32_t>(i));
  }
  tier::Index* index = classes_->index(object_bytes);
  if (index == nullptr)
    co_return Refusal{TransferErrc::tier_full,
                      "registration " + std::to_string(regs_.size()) + "'s objects (" + std::to_string(object_bytes) +
                          " B) do not fit the arena's " + std::to_string(classes_->slab_bytes()) +
                          " B slabs (sized by the first registration: register the group with the largest objects "
                          "first), or too many object sizes"};
  regs_.push_back(Attached{&reg, index});
  co_return Refusal{};
}

boost::asio::awaitable<Tier::LookupResult> LocalTier::lookup(std::uint32_t registration,
                                                            std::vector<kv::ChunkKey> keys) {
  if (registration >= regs_.size()) co_return LookupResult{};
  const Attached& a = regs_[registration];
  co_return LookupResult{a.index->lookup(keys, a.reg->layout.chunk_tokens), 0};
}

boost::asio::awaitable<std::error_code> LocalTier::save(Transfer& t) {
  const Registration& reg = *regs_.at(t.spec.registration).reg;
  tier::Index& index = *regs_.at(t.spec.registration).index;
  const kv::TransferSpec& s = t.spec;
  std::vector<std::byte*> objects(s.keys.size(), nullptr);
  std::vector<bool> images(s.keys.size(), false);
  std::vector<kv::ChunkKey> reserved;
  std::size_t refused = 0;
  for (std::size_t i = 0; i < s.keys.size(); ++i) {
    const bool image = s.with_state && s.state_slots[i] >= 0;
    std::uint32_t slot = 0;
    classes_->make_room(index, 1);
    switch (index.reserve(s.keys[i], image, &slot)) {
      case tier::Index::Reserve::reserved:
        objects[i] = object(index, slot);
        images[i] = image;
        reserved.push_back(s.keys[i]);
        break;
      case tier::Index::Reserve::exists: ++t.chunks_existed; break;  // never rewritten
      case tier::Index::Reserve::full: ++refused; break;
    }
  }
  std::error_code ec;
  if (!reserved.empty()) {
    bool copied = true;
    ec = co_await copy_and_wait(reactor_, t, *save_stream_, hip::CopyKind::device_to_host, segments(reg, s, objects, true, images), &copied);
    if (!copied) co_return ec;  // slots stay reserved: the copy may still write them
    for (const kv::ChunkKey& k : reserved) {
      if (ec) {
        index.abort(k);
      } else {
        index.commit(k);
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

boost::asio::awaitable<std::error_code> LocalTier::load(Transfer& t) {
  const Registration& reg = *regs_.at(t.spec.registration).reg;
  tier::Index& index = *regs_.at(t.spec.registration).index;
  const kv::TransferSpec& s = t.spec;
  auto slots = index.pin(s.keys);
  if (!slots) {
    t.reason = "the tier no longer holds every chunk of the load";
    co_return TransferErrc::missing_chunk;
  }
  if (s.with_state && !index.has_image(s.keys.back())) {
    index.unpin(s.keys);
    t.reason = "no checkpoint image stored at the load's end";
    co_return TransferErrc::missing_chunk;
  }
  std::vector<std::byte*> objects;
  for (std::uint32_t slot : *slots) objects.push_back(object(index, slot));
  std::vector<bool> images(objects.size(), false);
  if (s.with_state) images.back() = true;
  bool copied = true;
  std::error_code ec = co_await copy_and_wait(reactor_, t, *load_stream_, hip::CopyKind::host_to_device, segments(reg, s, objects, false, images),
                                     &copied);
  // Read locks go only once the copies out of the objects completed.
  if (copied) index.unpin(s.keys);
  co_return ec;
}

tier::Index::Stats LocalTier::stats() const { return classes_ ? classes_->stats() : tier::Index::Stats{}; }

}  // namespace kvstrand::reactor
