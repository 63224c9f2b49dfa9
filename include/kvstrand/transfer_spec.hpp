// One save or load as the scheduler decides it and the Connector takes it:
// the same type on both sides, no translation layer.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <kvstrand/block_leases.hpp>
#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/committed_blocks.hpp>
#include <kvstrand/token_range.hpp>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand::kv {

struct TransferSpec {
  std::string request;
  // The registration (KV-cache group) whose blocks and state slots these
  // are: the id Connector::register_layout returned (the first is 0).
  std::uint32_t registration = 0;
  TokenRange tokens;              // on the block grid; a save's is on the chunk grid
  std::vector<ChunkKey> keys;     // the chunks the range touches, in order
  std::vector<BlockId> blocks;    // one per block of the range: save source / load destination
  bool with_state = false;        // save: images at the chunk ends it covers; load: the image at tokens.end
  // Checkpoint image slots in the registered state memory. Save: one per key,
  // -1 where that chunk's end has no image. Load: one, the slot that
  // receives the image at tokens.end. A registration whose image is kept in
  // several memories (Registration::state_parts) takes one slot per memory
  // for each of those: key after key, memory after memory; a chunk's are all
  // -1 or none is.
  std::vector<std::int32_t> state_slots;
  BlockLeases::LeaseId lease = 0; // a save's source lease, released when it is source-safe
  // A load: the tier lease its lookup returned (LookupOutcome::lease), which
  // the load ends once its copy is done. 0: the tier leases what it needs.
  std::uint64_t tier_lease = 0;
  // A save, optionally: one entry per key, the engine's own description of
  // that chunk's blocks (docs/events.md: a msgpack map of its block hashes,
  // tokens and the like), kept with the object by a node tier's server and
  // published in its KV events. Opaque to kvstrand otherwise; an embedded
  // tier and servers before protocol 2.4 ignore it.
  std::vector<std::string> chunk_events;
};

// Builds the save of `tokens` for `request`: sources are the blocks committed
// now under `block_hashes` (one per block of the range), leased for the
// transfer's life. None (and no lease taken) if any block has no committed KV.
std::optional<TransferSpec> build_save(const std::string& request, TokenRange tokens, std::vector<ChunkKey> keys,
                                       std::span<const Digest> block_hashes, bool with_state,
                                       const CommittedBlocks& committed, BlockLeases& leases);

}  // namespace kvstrand::kv
#pragma GCC visibility pop
