// The KV geometry of one model on one rank, and the start-up checks on it.
//
// Every field that changes the stored bytes is here, because the namespace
// (namespace_id.hpp) hashes all of them: a stored object is only ever read
// back by a layout that would have written the same bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand::kv {

struct Plane {
  std::string name;
  std::uint64_t bytes_per_block = 0;
};

// Recurrent state the model carries (sliding-window rings, cursors). Its
// image is checkpointed at chunk boundaries and stored with the chunk that
// ends there. image_bytes == 0: the model has no recurrent state.
struct CheckpointSpec {
  std::string kind;                // e.g. "swa-ring+cursor"
  std::uint64_t image_bytes = 0;
  std::uint32_t interval_tokens = 0;  // must equal chunk_tokens
};

struct SpeculativeConfig {
  std::string method;         // e.g. "mtp", "eagle"; empty when off
  std::uint32_t num_tokens = 0;  // 0: speculative decoding off
  // Free-form parameters; their order does not matter (canonicalised).
  std::vector<std::pair<std::string, std::string>> params;

  bool enabled() const noexcept { return num_tokens > 0; }
};

// The most tokens one chunk may hold. Token counts are 32-bit; with this
// bound a lookup of thousands of chunks stays far from wrapping them.
inline constexpr std::uint32_t kMaxChunkTokens = 1u << 20;
inline constexpr std::size_t kMaxTenantName = 64;

struct Layout {
  std::string model_id;
  std::string layout_name;  // the layout this model's code defines
  std::uint32_t layout_version = 1;
  std::vector<Plane> planes;
  std::uint32_t block_tokens = 16;
  std::uint32_t chunk_tokens = 256;
  std::uint32_t sliding_window = 0;  // 0: none
  CheckpointSpec checkpoint;
  SpeculativeConfig speculative;
  std::string dtype;
  std::string tenant_salt;
  std::uint32_t tp_size = 1;
  std::uint32_t tp_rank = 0;
  // Every TP rank holds identical KV (e.g. MLA's latent
  // cache), so one copy is stored under rank 0 and every rank reads it.
  bool replicated_across_tp = false;
  // The weights the KV was computed with (a checkpoint's revision, an
  // online update's version): KV of other weights is never read back, as
  // the block hashes alone cover only the tokens. Empty: not said (the
  // namespace is then the same as before this field existed).
  std::string weight_version;
  // The tenant these objects belong to: a name, not a secret (a node
  // server's metrics and quotas, --tenant-quota, are by it), of at most 64
  // letters, digits, '.', '_' or '-'. In the namespace when set, so tenants
  // never share a chunk (tenant_salt keeps their keys unguessable too).
  // Empty: no tenant (the namespace is then the same as before this field).
  std::string tenant;

  bool has_state() const noexcept { return checkpoint.image_bytes > 0; }
  // Tokens a hit must leave to compute: 1, or 2 under speculative decoding.
  std::uint32_t prefill_tail() const noexcept { return speculative.enabled() ? 2 : 1; }
  std::uint32_t blocks_per_chunk() const noexcept { return block_tokens == 0 ? 0 : chunk_tokens / block_tokens; }
  std::uint64_t bytes_per_block() const noexcept;
  // One stored object: every plane's bytes for the chunk's blocks, plus the
  // checkpoint image when the save carried one.
  std::uint64_t object_bytes(bool with_image) const noexcept;
};

// A configuration kvstrand cannot serve correctly, naming the option.
struct ConfigError {
  std::string option;
  std::string message;
  std::string describe() const { return "invalid option '" + option + "': " + message; }
};

std::optional<ConfigError> validate(const Layout& layout);
// Why `name` cannot name a tenant (Layout::tenant); nothing when it can.
std::optional<std::string> tenant_problem(std::string_view name);

// Refuses an operator's layout override that names another layout when this
// layout owns recurrent state: the stored state images would not fit it.
// `override_name` empty means no override.
std::optional<ConfigError> check_layout_override(const Layout& layout, std::string_view override_name);

}  // namespace kvstrand::kv
#pragma GCC visibility pop
