#include <kvstrand/block_leases.hpp>

namespace kvstrand::kv {

BlockLeases::LeaseId BlockLeases::lease(std::span<const BlockId> blocks) {
  const LeaseId id = next_++;
  leases_.emplace(id, std::vector<BlockId>(blocks.begin(), blocks.end()));
  for (BlockId b : blocks) ++pins_[b];
  return id;
}

std::vector<BlockId> BlockLeases::release(LeaseId id) {
  std::vector<BlockId> returned;
  auto it = leases_.find(id);
  if (it == leases_.end()) return returned;  // already released: releasing twice frees nothing twice
  for (BlockId b : it->second) {
    auto pin = pins_.find(b);
    if (--pin->second > 0) continue;
    pins_.erase(pin);
    if (freed_but_pinned_.erase(b) != 0) returned.push_back(b);
  }
  leases_.erase(it);
  return returned;
}

bool BlockLeases::free(BlockId block) {
  if (!pins_.contains(block)) return true;
  freed_but_pinned_.insert(block);
  return false;
}

}  // namespace kvstrand::kv
