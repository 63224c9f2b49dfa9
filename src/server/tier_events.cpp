#include "server/tier_events.hpp"

namespace kvstrand::server {

struct TierEvents::Watched : tier::Index::Listener {
  TierEvents* owner = nullptr;
  const tier::Index* index = nullptr;
  const std::string* medium = nullptr;
  std::vector<std::string> descriptions;  // by slot
  std::vector<bool> announced;            // by slot: BlockStored was sent

  void grow(std::uint32_t slot) {
    if (slot >= descriptions.size()) {
      descriptions.resize(slot + 1);
      announced.resize(slot + 1, false);
    }
  }
  void reserved(std::uint32_t slot, const kv::ChunkKey&, bool) override {
    // A new object in the slot: no description until one is given.
    grow(slot);
    descriptions[slot].clear();
    announced[slot] = false;
  }
  void committed(std::uint32_t slot) override {
    grow(slot);
    if (descriptions[slot].empty()) return;
    owner->publisher_->stored(descriptions[slot], *medium);
    announced[slot] = true;
  }
  void freed(std::uint32_t slot) override {
    if (slot >= descriptions.size()) return;
    if (announced[slot]) owner->publisher_->removed(descriptions[slot], *medium);
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

void TierEvents::describe(const tier::Index& index, std::uint32_t slot, std::string description) {
  Watched* w = of(index);
  if (w == nullptr) return;
  w->grow(slot);
  w->descriptions[slot] = std::move(description);
}

std::string_view TierEvents::description(const tier::Index& index, std::uint32_t slot) const {
  const Watched* w = of(index);
  if (w == nullptr || slot >= w->descriptions.size()) return {};
  return w->descriptions[slot];
}

void TierEvents::copy(const tier::Index& from, std::uint32_t from_slot, const tier::Index& to, std::uint32_t to_slot) {
  const std::string_view d = description(from, from_slot);
  if (!d.empty()) describe(to, to_slot, std::string(d));
}

void TierEvents::announce_recovered(
    const std::unordered_map<kv::ChunkKey, std::string, tier::ChunkKeyHash>& found) {
  publisher_->cleared();
  for (auto& [index, w] : watched_) {
    for (std::uint32_t s = 0; s < index->slots(); ++s) {
      if (!index->readable_at(s)) continue;
      auto it = found.find(index->key_at(s));
      if (it == found.end()) continue;
      w->grow(s);
      w->descriptions[s] = it->second;
      w->committed(s);
    }
  }
}

}  // namespace kvstrand::server
