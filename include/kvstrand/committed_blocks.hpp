// Which device block holds the KV committed under each block hash now.
//
// A save's source is always looked up here at dispatch: the block committed
// under the hash now, never the recorded destination of an earlier load. A
// load's destinations are recorded when it is dispatched but become sources
// only when it lands; a load that fails drops its records, so when the
// engine recomputes that KV into other blocks, those are what a save reads.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include <kvstrand/digest.hpp>
#include <kvstrand/token_range.hpp>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand::kv {

class CommittedBlocks {
 public:
  // The engine committed the KV of `hash` in `block` (computed, or landed).
  void commit(const Digest& hash, BlockId block);
  // The block holding `hash` was evicted or reused.
  void evict(const Digest& hash);

  void record_load(std::uint64_t load_id, std::vector<std::pair<Digest, BlockId>> destinations);
  void load_settled(std::uint64_t load_id, bool landed);

  std::optional<BlockId> committed(const Digest& hash) const;
  // Every hash's committed block, in order; none if any hash has none.
  std::optional<std::vector<BlockId>> save_sources(std::span<const Digest> hashes) const;

 private:
  std::map<Digest, BlockId> committed_;
  std::map<std::uint64_t, std::vector<std::pair<Digest, BlockId>>> loads_;
};

}  // namespace kvstrand::kv
#pragma GCC visibility pop
