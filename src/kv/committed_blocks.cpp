#include <kvstrand/committed_blocks.hpp>

namespace kvstrand::kv {

void CommittedBlocks::commit(const Digest& hash, BlockId block) { committed_[hash] = block; }
void CommittedBlocks::evict(const Digest& hash) { committed_.erase(hash); }

void CommittedBlocks::record_load(std::uint64_t load_id, std::vector<std::pair<Digest, BlockId>> destinations) {
  loads_[load_id] = std::move(destinations);
}

void CommittedBlocks::load_settled(std::uint64_t load_id, bool landed) {
  auto it = loads_.find(load_id);
  if (it == loads_.end()) return;
  if (landed)
    for (const auto& [hash, block] : it->second) commit(hash, block);
  loads_.erase(it);  // a failed load's destinations are never a save's source
}

std::optional<BlockId> CommittedBlocks::committed(const Digest& hash) const {
  auto it = committed_.find(hash);
  if (it == committed_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::vector<BlockId>> CommittedBlocks::save_sources(std::span<const Digest> hashes) const {
  std::vector<BlockId> out;
  out.reserve(hashes.size());
  for (const Digest& h : hashes) {
    auto b = committed(h);
    if (!b) return std::nullopt;
    out.push_back(*b);
  }
  return out;
}

}  // namespace kvstrand::kv
