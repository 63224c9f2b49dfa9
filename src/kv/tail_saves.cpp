#include "kv/tail_saves.hpp"

namespace kvstrand::kv {

std::optional<TailSave> TailSaves::take(const std::string& request) {
  auto it = saves_.find(request);
  if (it == saves_.end()) return std::nullopt;
  TailSave s = std::move(it->second);
  saves_.erase(it);
  return s;
}

std::vector<BlockId> TailSaves::retire(const std::string& request, BlockLeases& leases) {
  auto s = take(request);
  if (!s) return {};
  return leases.release(s->lease);
}

}  // namespace kvstrand::kv
