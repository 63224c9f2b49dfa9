// Finished requests' saves that were not dispatched before they finished.
//
// When a request finishes with its tail save still undispatched, the save
// keeps everything it needs here (keys, source blocks, their lease) so it
// can still be dispatched after the request's own state is gone. Otherwise
// it is retired explicitly, and its lease is released through
// BlockLeases::release(). No lease is held forever: every entry ends taken
// or retired.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <kvstrand/block_leases.hpp>
#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/token_range.hpp>

namespace kvstrand::kv {

struct TailSave {
  TokenRange tokens;
  std::vector<ChunkKey> keys;
  std::vector<BlockId> sources;
  BlockLeases::LeaseId lease = 0;
};

class TailSaves {
 public:
  void keep(const std::string& request, TailSave save) { saves_[request] = std::move(save); }
  // For dispatch: the save leaves the registry with its lease still held
  // (the transfer releases it when source-safe).
  std::optional<TailSave> take(const std::string& request);
  // Gives the save up; returns the blocks its lease release returned to the pool.
  std::vector<BlockId> retire(const std::string& request, BlockLeases& leases);
  std::size_t size() const noexcept { return saves_.size(); }

 private:
  std::map<std::string, TailSave> saves_;
};

}  // namespace kvstrand::kv
