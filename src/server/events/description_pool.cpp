#include "server/events/description_pool.hpp"

#define XXH_INLINE_ALL  // header-only, as everywhere here: no libxxhash to link or carry
#include <xxhash.h>

#include <cstring>
#include <random>

namespace kvstrand::server {

DescriptionPool::DescriptionPool() : seed_((std::uint64_t{std::random_device{}()} << 32) | std::random_device{}()) {}

std::uint32_t DescriptionPool::hash_of(std::string_view d) const noexcept {
  return static_cast<std::uint32_t>(XXH3_64bits_withSeed(d.data(), d.size(), seed_));
}

std::string_view DescriptionPool::at(Id id) const noexcept {
  if (id == kNone) return {};
  const char* p = entries_[id - 1].bytes.get();
  std::uint32_t size = 0;
  std::memcpy(&size, p, sizeof size);
  return {p + sizeof size, size};
}

std::size_t DescriptionPool::slot_of(std::string_view d, std::uint32_t hash) const noexcept {
  const std::size_t mask = table_.size() - 1;
  // Ends: the table is at most half full, so an empty slot comes.
  for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
    const Id id = table_[i];
    if (id == kNone || (entries_[id - 1].hash == hash && at(id) == d)) return i;
  }
}

void DescriptionPool::grow() {
  std::vector<Id> old = std::move(table_);
  table_.assign(old.empty() ? 64 : old.size() * 2, kNone);
  const std::size_t mask = table_.size() - 1;
  for (const Id id : old) {
    if (id == kNone) continue;
    std::size_t i = entries_[id - 1].hash & mask;
    while (table_[i] != kNone) i = (i + 1) & mask;
    table_[i] = id;
  }
}

DescriptionPool::Id DescriptionPool::hold(std::string_view description) {
  if (description.empty()) return kNone;
  if ((live_ + 1) * 2 > table_.size()) grow();
  const std::uint32_t hash = hash_of(description);
  const std::size_t i = slot_of(description, hash);
  if (table_[i] != kNone) {
    ++entries_[table_[i] - 1].holders;
    return table_[i];
  }
  Id id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    entries_.emplace_back();
    id = static_cast<Id>(entries_.size());
  }
  Entry& e = entries_[id - 1];
  const auto size = static_cast<std::uint32_t>(description.size());
  e.bytes = std::make_unique_for_overwrite<char[]>(sizeof size + size);
  std::memcpy(e.bytes.get(), &size, sizeof size);
  std::memcpy(e.bytes.get() + sizeof size, description.data(), size);
  e.holders = 1;
  e.hash = hash;
  table_[i] = id;
  ++live_;
  bytes_ += size;
  return id;
}

void DescriptionPool::hold(Id id) noexcept {
  if (id != kNone) ++entries_[id - 1].holders;
}

void DescriptionPool::release(Id id) noexcept {
  if (id == kNone || --entries_[id - 1].holders != 0) return;
  bytes_ -= at(id).size();
  unlink(id);
  entries_[id - 1].bytes.reset();
  free_.push_back(id);
  --live_;
}

// Backward-shift deletion: every id after it in its run that may move up
// does, so a probe never stops at a hole before what it looks for.
void DescriptionPool::unlink(Id id) noexcept {
  const std::size_t mask = table_.size() - 1;
  std::size_t i = entries_[id - 1].hash & mask;
  while (table_[i] != id) i = (i + 1) & mask;
  for (std::size_t j = (i + 1) & mask; table_[j] != kNone; j = (j + 1) & mask) {
    const std::size_t home = entries_[table_[j] - 1].hash & mask;
    // The id at j stays where its home lies cyclically in (i, j].
    const bool stays = i < j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    table_[i] = table_[j];
    i = j;
  }
  table_[i] = kNone;
}

}  // namespace kvstrand::server
