// Which device blocks in-flight transfers still read, and when a block that
// the engine freed really returns to the pool.
//
// - A save's source blocks are leased from dispatch until source-safe (the
//   copy out of them completed), so the engine cannot reuse them early.
// - release() is the one function every lease release goes through: a save
//   becoming source-safe, a finished request's tail save being retired, an
//   abandoned request. It returns exactly the blocks it returned to the pool.
// - free() reports a block as returned only when it really is: a leased
//   block stays out of the pool until its last lease is released.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <kvstrand/token_range.hpp>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand::kv {

class BlockLeases {
 public:
  using LeaseId = std::uint64_t;

  LeaseId lease(std::span<const BlockId> blocks);
  std::vector<BlockId> release(LeaseId id);
  // The engine is done with `block`. True: it is back in the pool now.
  // False: a lease pins it; the release that drops the last pin returns it.
  bool free(BlockId block);

  // A release would return memory to the pool (some freed block waits only
  // on leases). An engine asks this before it waits instead of preempting.
  bool release_would_free() const noexcept { return !freed_but_pinned_.empty(); }
  bool is_leased(BlockId block) const { return pins_.contains(block); }
  std::size_t live_leases() const noexcept { return leases_.size(); }

 private:
  LeaseId next_ = 1;
  std::unordered_map<LeaseId, std::vector<BlockId>> leases_;
  std::unordered_map<BlockId, std::uint32_t> pins_;
  std::unordered_set<BlockId> freed_but_pinned_;
};

}  // namespace kvstrand::kv
#pragma GCC visibility pop
