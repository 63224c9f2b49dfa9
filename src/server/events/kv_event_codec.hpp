// vLLM's KV event batches as the server publishes them (vLLM's
// vllm/distributed/kv_events.py: KVEventBatch of BlockStored, BlockRemoved,
// AllBlocksCleared, encoded with msgspec's msgpack), in the three shapes
// vLLM has used:
// - array: the batch [ts, events] and each event a tagged array
//   ["BlockStored", block_hashes, ...], fields in declaration order, trailing
//   defaults left out (vLLM until its PR 42892, v0.18 among them);
// - events-map: the batch an array, each event a map whose "type" is its tag
//   (from PR 42892: v0.26);
// - map: the batch a map too ({"ts", "events"}: vLLM's main since).
// Subscribers select by name; none needs data_parallel_rank, which the
// server, no DP rank of any engine, leaves out (a default).
//
// What an event says of a chunk comes from its description, sent by the
// engine with the reserve (docs/events.md): a msgpack map whose values are
// copied into the event as they are.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "server/events/msgpack.hpp"

namespace kvstrand::server {

enum class EventFormat { array, events_map, map };
std::optional<EventFormat> event_format(std::string_view name);
const char* to_string(EventFormat f) noexcept;

// The largest chunk description kept (a 256-token chunk's is about 1.5 KiB).
inline constexpr std::size_t kMaxDescriptionBytes = 16 * 1024;

// Why `description` cannot describe a chunk; nothing when it can: at most
// kMaxDescriptionBytes, a map with string keys whose fields have the types
// vLLM's BlockStored gives them (msgspec refuses a batch with one wrong):
// "block_hashes" an array of at least one hash (bytes or an integer),
// "block_size" a positive integer, "token_ids" an array of integers,
// "parent_block_hash", "lora_id", "lora_name", "group_idx", "extra_keys",
// "kv_cache_spec_kind", "kv_cache_spec_sliding_window" their type or nil
// where present.
std::optional<std::string> description_problem(std::string_view description);

// One event appended to an events array being written. `description` was
// accepted by description_problem.
void encode_stored(msgpack::Writer& w, std::string_view description, std::string_view medium, EventFormat f);
void encode_removed(msgpack::Writer& w, std::string_view description, std::string_view medium, EventFormat f);
void encode_cleared(msgpack::Writer& w, EventFormat f);

// What BlockRemoved takes of a description (its block_hashes, and its
// group_idx where given), as a description of its own: all the server keeps
// of one once BlockStored has gone out and no level below still needs the
// whole (TierEvents::keep_removal_only). Nothing when it is not a map.
std::optional<std::string> removal_part(std::string_view description);

// A whole batch: `events`, `count` events encoded by the above, at `ts`
// (seconds since the epoch).
std::string encode_batch(double ts, std::string_view events, std::uint32_t count, EventFormat f);

}  // namespace kvstrand::server
