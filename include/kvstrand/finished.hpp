// What finished() hands the engine: every transfer and lookup that became
// terminal since the last call.
#pragma once

#include <cstdint>
#include <string>
#include <system_error>
#include <vector>

#include <kvstrand/hit_plan.hpp>
#include <kvstrand/token_range.hpp>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand {

enum class TransferKind { save, load };
const char* to_string(TransferKind k) noexcept;

struct TransferOutcome {
  std::string request;
  TransferKind kind = TransferKind::save;
  std::uint32_t registration = 0;  // the KV-cache group whose blocks these are
  bool ok = false;
  std::error_code error;
  std::string reason;
  kv::TokenRange tokens;
  std::vector<kv::BlockId> blocks;  // a failed load: exactly the blocks it would have written
};

// Blocks of a save that the engine may reuse (the copy out of them is done).
struct SourceSafe {
  std::string request;
  std::uint32_t registration = 0;
  std::vector<kv::BlockId> blocks;
};

struct LookupOutcome {
  std::uint64_t id = 0;
  kv::HitSource hit;
  // What keeps the hit stored until it is loaded: name it in the load's
  // spec (tier_lease), or give it back with Connector::release_lookup when
  // no load will. 0: the tier holds nothing for this lookup.
  std::uint64_t lease = 0;
  std::uint32_t registration = 0;  // the group the lookup asked about
};

// What Connector::order_after_load did.
enum class LoadOrder {
  ordered,         // the stream now waits, on the device, for the load's copies
  not_queued_yet,  // its copies are not queued yet (waiting for its producer or the tier): ask again, or wait
                   // for its outcome in finished()
  no_live_load,    // no load of that request and group is posted and undrained
};

struct Finished {
  std::vector<TransferOutcome> saves;
  std::vector<TransferOutcome> loads;
  std::vector<SourceSafe> source_safe;
  std::vector<LookupOutcome> lookups;

  bool empty() const noexcept { return saves.empty() && loads.empty() && source_safe.empty() && lookups.empty(); }
  std::vector<const TransferOutcome*> failed_loads() const;
};

}  // namespace kvstrand
#pragma GCC visibility pop
