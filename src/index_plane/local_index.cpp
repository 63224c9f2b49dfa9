#include "index_plane/local_index.hpp"

#include <algorithm>

#include "index_plane/transfer_error.hpp"

#include <kvstrand/namespace_id.hpp>

namespace kvstrand::index_plane {

namespace asio = boost::asio;

asio::awaitable<Failure> LocalIndex::attach_registration(std::uint32_t id) {
  const std::uint64_t object_bytes = registrations().at(id).object_bytes();
  if (!arena_) {
    // At least 16 slabs where objects allow (room for other registrations'
    // sizes), at most kSlabBytes each, never smaller than this object.
    const std::uint64_t slab = std::min(capacity_, std::max(object_bytes, std::min(kSlabBytes, capacity_ / 16)));
    const std::uint64_t slabs = slab == 0 ? 0 : capacity_ / slab;
    if (slabs == 0 || object_bytes > slab)
      co_return Failure{TransferErrc::tier_full, "tier_bytes " + std::to_string(capacity_) +
                                                     " cannot hold one object of " + std::to_string(object_bytes) +
                                                     " bytes"};
    auto arena = device::PinnedBuffer::allocate(slabs * slab);
    if (!arena.ok())
      co_return Failure{TransferErrc::device_error, "the embedded tier's arena: " + arena.status().describe()};
    arena_ = std::make_shared<device::PinnedBuffer>(std::move(arena).value());
    classes_.emplace(slab);
    for (std::uint64_t i = 0; i < slabs; ++i) classes_->add_slab(static_cast<std::uint32_t>(i));
  }
  tier::Index* index = classes_->index(object_bytes);
  if (index == nullptr)
    co_return Failure{TransferErrc::tier_full,
                      "registration " + std::to_string(id) + "'s objects (" + std::to_string(object_bytes) +
                          " B) do not fit the arena's " + std::to_string(classes_->slab_bytes()) +
                          " B slabs (sized by the first registration: register the group with the largest objects "
                          "first), or too many object sizes"};
  indexes_.push_back(index);
  co_return Failure{};
}

asio::awaitable<IndexPlane::LookupResult> LocalIndex::lookup(std::uint32_t registration,
                                                            std::vector<kv::ChunkKey> keys) {
  if (registration >= indexes_.size()) co_return LookupResult{};
  co_return LookupResult{indexes_[registration]->lookup(keys, registrations().at(registration).layout.chunk_tokens), 0};
}

asio::awaitable<IndexPlane::Places> LocalIndex::reserve(std::uint32_t registration,
                                                       const std::vector<kv::ChunkKey>& keys,
                                                       const std::vector<bool>& images,
                                                       const std::vector<std::string>& /*events: a server's only*/,
                                                       Clock::time_point) {
  tier::Index& index = *index_of(registration);
  Places p;
  p.objects.assign(keys.size(), nullptr);
  p.memory = arena_;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::uint32_t slot = 0;
    classes_->make_room(index, 1);
    switch (index.reserve(keys[i], images[i], &slot)) {
      case tier::Index::Reserve::reserved: p.objects[i] = object(index, slot); break;
      case tier::Index::Reserve::exists: break;  // never rewritten
      case tier::Index::Reserve::full: ++p.refused; break;
    }
  }
  co_return p;
}

asio::awaitable<Failure> LocalIndex::commit(std::uint32_t registration, const std::vector<kv::ChunkKey>& keys,
                                            const Places& places, bool copied, Clock::time_point) {
  tier::Index& index = *index_of(registration);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (places.objects[i] == nullptr) continue;
    if (copied) {
      index.commit(keys[i]);
    } else {
      index.abort(keys[i]);
    }
  }
  co_return Failure{};
}

asio::awaitable<IndexPlane::Held> LocalIndex::hold(const kv::TransferSpec& s, Clock::time_point) {
  // This class's own answer (always one), not an override's.
  co_return *LocalIndex::hold_now(s);
}

std::optional<IndexPlane::Held> LocalIndex::hold_now(const kv::TransferSpec& s) {
  Held h;
  if (s.registration >= indexes_.size()) return h;
  tier::Index& index = *indexes_[s.registration];
  auto slots = index.read_lock(s.keys);  // read locks: all of them or none
  if (!slots) return h;
  h.hold = 1;
  h.memory = arena_;
  h.objects.reserve(slots->size());
  for (std::uint32_t slot : *slots) h.objects.push_back(object(index, slot));
  h.image_at_end = !s.keys.empty() && index.image_at(slots->back());
  return h;
}

void LocalIndex::release(const kv::TransferSpec& s, const Held& held) {
  if (held.hold != 0) index_of(s.registration)->read_unlock(s.keys);
}

asio::awaitable<IndexPlane::Dropped> LocalIndex::drop(std::uint32_t registration) {
  Dropped d;
  if (classes_ && registration < indexes_.size())
    d.objects = classes_->drop_namespace(kv::namespace_of(registrations().at(registration).layout));
  co_return d;
}

tier::Index::Stats LocalIndex::stats() const { return classes_ ? classes_->stats() : tier::Index::Stats{}; }

}  // namespace kvstrand::index_plane
