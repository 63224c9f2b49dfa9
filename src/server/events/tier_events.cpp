#include "server/events/tier_events.hpp"

#include "server/events/kv_event_codec.hpp"

namespace kvstrand::server {

struct TierEvents::Watched : tier::Index::Listener {
  TierEvents* owner = nullptr;
  const tier::Index* index = nullptr;
  const std::string* medium = nullptr;
  std::vector<DescriptionPool::Id> ids;  // by slot: its description in owner->pool_
  std::vector<bool> announced;           // by slot: BlockStored was sent
  std::vector<bool> removal_only;        // by slot: only BlockRemoved's part is held

  void grow(std::uint32_t slot) {
    if (slot >= ids.size()) {
      ids.resize(slot + 1, DescriptionPool::kNone);
      announced.resize(slot + 1, false);
      removal_only.resize(slot + 1, false);
    }
  }
  void set(std::uint32_t slot, DescriptionPool::Id id, bool part = false) {  // id already held for the slot
    grow(slot);
    owner->pool_->release(ids[slot]);
    ids[slot] = id;
    removal_only[slot] = part;
  }
  void reserved(std::uint32_t slot, const kv::ChunkKey&, bool) override {
    // A new object in the slot: no description until one is given.
    set(slot, DescriptionPool::kNone);
    announced[slot] = false;
  }
  void committed(std::uint32_t slot) override {
    grow(slot);
    // BlockStored needs the whole description: a part alone says nothing.
    if (ids[slot] == DescriptionPool::kNone || removal_only[slot]) return;
    owner->publisher_->stored(owner->pool_->at(ids[slot]), *medium);
    announced[slot] = true;
  }
  void freed(std::uint32_t slot) override {
    if (slot >= ids.size()) return;
    if (announced[slot]) owner->publisher_->removed(owner->pool_->at(ids[slot]), *medium);
    announced[slot] = false;
    // Kept until the slot is reserved again: a dropped object still held is
    // freed a second time at its release, and says nothing more then.
  }
  bool whole(std::uint32_t slot) const {
    return slot < ids.size() && ids[slot] != DescriptionPool::kNone && !removal_only[slot];
  }
  // The slot, announced, keeps BlockRemoved's part alone (a description
  // that is no map, which the server never keeps, stays whole).
  void keep_removal_only(std::uint32_t slot) {
    if (!whole(slot) || !announced[slot]) return;
    const auto part = removal_part(owner->pool_->at(ids[slot]));
    if (part) set(slot, owner->pool_->hold(*part), true);
  }
};

TierEvents::TierEvents(std::shared_ptr<EventPublisher> publisher)
    : publisher_(std::move(publisher)), pool_(std::make_shared<DescriptionPool>()) {}

TierEvents::~TierEvents() {
  for (auto& [index, w] : watched_) {
    const_cast<tier::Index*>(index)->set_observer(nullptr);
    for (DescriptionPool::Id id : w->ids) pool_->release(id);  // the pool may outlive this (shared_descriptions)
  }
}

void TierEvents::watch(tier::SizeClasses& classes, std::string medium) {
  media_.push_back(std::make_unique<std::string>(std::move(medium)));
  const std::string* m = media_.back().get();
  classes.on_class_made([this, m](tier::Index& index) {
    auto w = std::make_unique<Watched>();
    w->owner = this;
    w->index = &index;
    w->medium = m;
    index.set_observer(w.get());
    watched_[&index] = std::move(w);
  });
}

TierEvents::Watched* TierEvents::of(const tier::Index& index) const {
  auto it = watched_.find(&index);
  return it == watched_.end() ? nullptr : it->second.get();
}

void TierEvents::describe(const tier::Index& index, std::uint32_t slot, std::string_view description) {
  Watched* w = of(index);
  if (w == nullptr) return;
  w->set(slot, pool_->hold(description));
}

void TierEvents::describe(const tier::Index& index, std::uint32_t slot, DescriptionPool::Id held) {
  Watched* w = of(index);
  if (w == nullptr || held == DescriptionPool::kNone) return;
  pool_->hold(held);
  w->set(slot, held);
}

std::string_view TierEvents::description(const tier::Index& index, std::uint32_t slot) const {
  const Watched* w = of(index);
  if (w == nullptr || slot >= w->ids.size()) return {};
  return pool_->at(w->ids[slot]);
}

DescriptionPool::Id TierEvents::hold_whole(const tier::Index& index, std::uint32_t slot) {
  const Watched* w = of(index);
  if (w == nullptr || !w->whole(slot)) return DescriptionPool::kNone;
  pool_->hold(w->ids[slot]);
  return w->ids[slot];
}

void TierEvents::keep_removal_only(const tier::Index& index, std::span<const std::uint32_t> slots) {
  Watched* w = of(index);
  if (w == nullptr) return;
  for (std::uint32_t s : slots) w->keep_removal_only(s);
}

void TierEvents::copy(const tier::Index& from, std::uint32_t from_slot, const tier::Index& to, std::uint32_t to_slot) {
  const Watched* f = of(from);
  Watched* t = of(to);
  if (f == nullptr || t == nullptr || !f->whole(from_slot)) return;
  // The copy holds the same description: one in memory for both.
  pool_->hold(f->ids[from_slot]);
  t->set(to_slot, f->ids[from_slot]);
}

void TierEvents::announce_recovered(
    const std::unordered_map<kv::ChunkKey, std::string, tier::ChunkKeyHash>& found) {
  publisher_->cleared();
  for (auto& [index, w] : watched_) {
    for (std::uint32_t s = 0; s < index->slots(); ++s) {
      if (!index->readable_at(s)) continue;
      auto it = found.find(index->key_at(s));
      if (it == found.end()) continue;
      w->set(s, pool_->hold(it->second));
      w->committed(s);
      // Found on the disk, whose header block keeps the whole one; the
      // object is written behind already.
      w->keep_removal_only(s);
    }
  }
}

}  // namespace kvstrand::server
