#include "server/tier_events.hpp"

namespace kvstrand::server {

struct TierEvents::Watched : tier::Index::Listener {
  TierEvents* owner = nullptr;
  const tier::Index* index = nullptr;
  const std::string* medium = nullptr;
  std::vector<DescriptionPool::Id> ids;  // by slot: its description in owner->pool_
  std::vector<bool> announced;           // by slot: BlockStored was sent

  void grow(std::uint32_t slot) {
    if (slot >= ids.size()) {
      ids.resize(slot + 1, DescriptionPool::kNone);
      announced.resize(slot + 1, false);
    }
  }
  void set(std::uint32_t slot, DescriptionPool::Id id) {  // id already held for the slot
    grow(slot);
    owner->pool_.release(ids[slot]);
    ids[slot] = id;
  }
  void reserved(std::uint32_t slot, const kv::ChunkKey&, bool) override {
    // A new object in the slot: no description until one is given.
    set(slot, DescriptionPool::kNone);
    announced[slot] = false;
  }
  void committed(std::uint32_t slot) override {
    grow(slot);
    if (ids[slot] == DescriptionPool::kNone) return;
    owner->publisher_->stored(owner->pool_.at(ids[slot]), *medium);
    announced[slot] = true;
  }
  void freed(std::uint32_t slot) override {
    if (slot >= ids.size()) return;
    if (announced[slot]) owner->publisher_->removed(owner->pool_.at(ids[slot]), *medium);
    announced[slot] = false;
    // Kept until the slot is reserved again: a dropped object still held is
    // freed a second time at its release, and says nothing more then.
  }
};

TierEvents::TierEvents(std::shared_ptr<EventPublisher> publisher) : publisher_(std::move(publisher)) {}

TierEvents::~TierEvents() {
  for (auto& [index, w] : watched_) const_cast<tier::Index*>(index)->set_observer(nullptr);
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
  w->set(slot, pool_.hold(description));
}

std::string_view TierEvents::description(const tier::Index& index, std::uint32_t slot) const {
  const Watched* w = of(index);
  if (w == nullptr || slot >= w->ids.size()) return {};
  return pool_.at(w->ids[slot]);
}

void TierEvents::copy(const tier::Index& from, std::uint32_t from_slot, const tier::Index& to, std::uint32_t to_slot) {
  const Watched* f = of(from);
  Watched* t = of(to);
  if (f == nullptr || t == nullptr || from_slot >= f->ids.size() || f->ids[from_slot] == DescriptionPool::kNone) return;
  // The copy holds the same description: one in memory for both.
  pool_.hold(f->ids[from_slot]);
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
      w->set(s, pool_.hold(it->second));
      w->committed(s);
    }
  }
}

}  // namespace kvstrand::server
