// SpareNodes<Map>: a node-based map's (std::map, std::unordered_map) erased
// nodes kept for its next inserts.
//
// An entry's strings and vectors keep their capacity in a kept node, so an
// insert that refills one allocates nothing; the node itself is not freed
// and made again. Used where an entry is made and ended every step (the
// Connector's live transfers): memory the
// other thread frees or a warm step allocates is what made the engine's own
// code slower beside kvstrand (docs/PERFORMANCE.md, "Step-thread cost").
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace kvstrand::connector {

template <class Map>
class SpareNodes {
 public:
  // Inserts an entry that fill(key&, mapped&) writes, into a kept node when
  // there is one (fill then assigns over its old contents).
  template <class Fill>
  typename Map::iterator insert(Map& map, Fill fill) {
    if (spare_.empty()) {
      typename Map::key_type key{};
      typename Map::mapped_type value{};
      fill(key, value);
      return map.emplace(std::move(key), std::move(value)).first;
    }
    typename Map::node_type n = std::move(spare_.back());
    spare_.pop_back();
    fill(n.key(), n.mapped());
    return map.insert(std::move(n)).position;
  }

  // Ends an entry, keeping its node: at most kMax of them, so a burst
  // leaves a bounded amount behind.
  void erase(Map& map, typename Map::iterator it) {
    if (spare_.size() < kMax)
      spare_.push_back(map.extract(it));
    else
      map.erase(it);
  }

 private:
  static constexpr std::size_t kMax = 1024;
  std::vector<typename Map::node_type> spare_;
};

}  // namespace kvstrand::connector
