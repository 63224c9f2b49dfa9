#include "connector/lookup_book.hpp"

#include <algorithm>

#include "index_plane/transfer_error.hpp"

namespace kvstrand::connector {

std::uint64_t LookupBook::start() {
  if (live_ >= max_live_)
    throw TransferRefused(TransferErrc::too_many_live, std::to_string(live_) +
                                                           " lookups unanswered or undrained: max_live_lookups (" +
                                                           std::to_string(max_live_) +
                                                           ") reached; drain finished() first");
  ++live_;
  return next_++;
}

void LookupBook::asked(std::uint64_t id, std::uint32_t registration, const std::vector<kv::ChunkKey>& keys) {
  if (leases_) asked_[id] = Asked{registration, keys};
}

std::vector<kv::ChunkKey> LookupBook::take(std::uint64_t lease) {
  auto it = held_.find(lease);
  if (lease == 0 || it == held_.end())
    throw TransferRefused(TransferErrc::bad_spec, "export_lease: lease " + std::to_string(lease) +
                                                      " is not held here (never drained from finished(), already "
                                                      "named by a load, released or exported)");
  std::vector<kv::ChunkKey> keys = std::move(it->second.keys);
  held_.erase(it);
  return keys;
}

void LookupBook::answered(const Finished& f, const std::vector<Registration>& registrations) {
  live_ -= std::min(live_, f.lookups.size());
  // A lease an answer brought: what it holds, for export_lease.
  for (const auto& l : f.lookups) {
    auto it = asked_.find(l.id);
    if (it == asked_.end()) continue;
    const std::uint32_t ct = registrations.at(it->second.registration).layout.chunk_tokens;
    const std::size_t n = ct == 0 ? 0 : l.hit.tokens / ct;
    if (l.lease != 0 && n > 0 && n <= it->second.keys.size()) {
      it->second.keys.resize(n);
      held_[l.lease] = std::move(it->second);
    }
    asked_.erase(it);
  }
}

}  // namespace kvstrand::connector
