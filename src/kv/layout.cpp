#include <kvstrand/layout.hpp>

#include <algorithm>
#include <set>

namespace kvstrand::kv {

std::uint64_t Layout::bytes_per_block() const noexcept {
  std::uint64_t n = 0;
  for (const Plane& p : planes) n += p.bytes_per_block;
  return n;
}

std::uint64_t Layout::object_bytes(bool with_image) const noexcept {
  return bytes_per_block() * blocks_per_chunk() + (with_image ? checkpoint.image_bytes : 0);
}

std::optional<std::string> tenant_problem(std::string_view name) {
  // A metric label's value and a flag's: plain characters only.
  if (name.size() <= kMaxTenantName && std::all_of(name.begin(), name.end(), [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
               ch == '_' || ch == '-';
      }))
    return std::nullopt;
  return "'" + std::string(name) + "' is not a name of at most 64 letters, digits, '.', '_' or '-'";
}

std::optional<ConfigError> validate(const Layout& l) {
  auto err = [](std::string option, std::string msg) { return ConfigError{std::move(option), std::move(msg)}; };
  if (l.model_id.empty()) return err("model_id", "must name the model");
  if (l.layout_name.empty()) return err("layout_name", "must name the KV layout");
  if (l.planes.empty()) return err("planes", "at least one plane is needed");
  std::set<std::string> names;
  for (const Plane& p : l.planes) {
    if (p.name.empty()) return err("planes", "every plane needs a name");
    if (!names.insert(p.name).second) return err("planes", "plane '" + p.name + "' appears twice");
    if (p.bytes_per_block == 0) return err("planes", "plane '" + p.name + "' has 0 bytes per block");
  }
  if (l.block_tokens == 0) return err("block_tokens", "must be > 0");
  if (l.chunk_tokens == 0 || l.chunk_tokens % l.block_tokens != 0)
    return err("chunk_tokens", "must be a positive multiple of block_tokens (" + std::to_string(l.block_tokens) +
                                   "), got " + std::to_string(l.chunk_tokens));
  if (l.chunk_tokens > kMaxChunkTokens)
    return err("chunk_tokens", "must be at most " + std::to_string(kMaxChunkTokens) + ", got " +
                                   std::to_string(l.chunk_tokens));
  if (l.has_state() && l.checkpoint.interval_tokens != l.chunk_tokens)
    return err("checkpoint.interval_tokens",
               "checkpoints are stored with the chunk that ends at them, so the interval must equal chunk_tokens (" +
                   std::to_string(l.chunk_tokens) + "), got " + std::to_string(l.checkpoint.interval_tokens));
  if (!l.has_state() && l.checkpoint.interval_tokens != 0)
    return err("checkpoint.image_bytes", "a checkpoint interval is set but the image size is 0");
  if (l.speculative.enabled() && l.speculative.method.empty())
    return err("speculative.method", "speculative decoding is on (num_tokens > 0) but no method is named");
  if (l.dtype.empty()) return err("dtype", "must name the KV dtype");
  if (auto why = tenant_problem(l.tenant)) return err("tenant", *why);
  if (l.tp_size == 0 || l.tp_rank >= l.tp_size)
    return err("tp_rank", "must be < tp_size (" + std::to_string(l.tp_size) + "), got " + std::to_string(l.tp_rank));
  // Every size derived from these is a 64-bit product the tiers compute and
  // a client may send: refuse what would wrap, checked once here.
  std::uint64_t per_block = 0, object = 0;
  for (const Plane& p : l.planes)
    if (__builtin_add_overflow(per_block, p.bytes_per_block, &per_block))
      return err("planes", "the planes' bytes per block add up past 2^64");
  if (__builtin_mul_overflow(per_block, std::uint64_t{l.blocks_per_chunk()}, &object))
    return err("planes", "a chunk's blocks (bytes per block x blocks per chunk) are past 2^64 bytes");
  if (__builtin_add_overflow(object, l.checkpoint.image_bytes, &object))
    return err("checkpoint.image_bytes", "a chunk's object (its blocks + the image) is past 2^64 bytes");
  return std::nullopt;
}

std::optional<ConfigError> check_layout_override(const Layout& l, std::string_view override_name) {
  if (override_name.empty() || override_name == l.layout_name) return std::nullopt;
  if (!l.has_state()) return std::nullopt;
  return ConfigError{"layout_override", "names layout '" + std::string(override_name) + "', but model '" +
                                             l.model_id + "' uses layout '" + l.layout_name +
                                             "', which owns recurrent state; its checkpoints only fit its own layout. "
                                             "Remove the override."};
}

}  // namespace kvstrand::kv
