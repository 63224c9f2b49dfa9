#include "reactor/registration.hpp"

#include <kvstrand/transfer_spec.hpp>

#include <cstdint>

namespace kvstrand {

std::optional<std::string> Registration::check() const {
  if (auto err = kv::validate(layout)) return err->describe();
  if (lookup_only()) return std::nullopt;
  if (planes.size() != layout.planes.size())
    return "register_layout: " + std::to_string(planes.size()) + " plane memories for " +
           std::to_string(layout.planes.size()) + " planes";
  std::uint64_t end = 0;  // the byte past each memory: no address computed from it may wrap
  for (std::size_t p = 0; p < planes.size(); ++p) {
    if (planes[p].base == nullptr || planes[p].num_blocks == 0)
      return "register_layout: plane '" + layout.planes[p].name + "' has no device memory";
    if (__builtin_mul_overflow(std::uint64_t{planes[p].num_blocks}, layout.planes[p].bytes_per_block, &end) ||
        __builtin_add_overflow(reinterpret_cast<std::uintptr_t>(planes[p].base), end, &end))
      return "register_layout: plane '" + layout.planes[p].name + "': num_blocks x bytes_per_block runs past the "
             "address space";
  }
  if (layout.has_state()) {
    if (state.base == nullptr || state.slots == 0)
      return "register_layout: the layout has recurrent state but no state memory was given";
    if (__builtin_mul_overflow(std::uint64_t{state.slots}, layout.checkpoint.image_bytes, &end) ||
        __builtin_add_overflow(reinterpret_cast<std::uintptr_t>(state.base), end, &end))
      return "register_layout: state: slots x checkpoint.image_bytes runs past the address space";
  }
  return std::nullopt;
}

namespace {
std::optional<std::string> check_common(const Registration& r, const kv::TransferSpec& s) {
  const kv::Layout& l = r.layout;
  if (r.lookup_only()) return "its registration has no device memory: it serves lookups only";
  if (s.tokens.empty()) return "empty token range";
  if (s.tokens.begin % l.block_tokens != 0 || s.tokens.end % l.block_tokens != 0)
    return "token range is not on the block grid";
  if (s.blocks.size() != s.tokens.size() / l.block_tokens)
    return "expected " + std::to_string(s.tokens.size() / l.block_tokens) + " blocks, got " +
           std::to_string(s.blocks.size());
  // In 64 bits: an end near 2^32 must not wrap to an empty key list.
  const std::uint64_t first = s.tokens.begin / l.chunk_tokens;
  const std::uint64_t last = (std::uint64_t{s.tokens.end} + l.chunk_tokens - 1) / l.chunk_tokens;
  if (s.keys.size() != last - first)
    return "expected " + std::to_string(last - first) + " chunk keys, got " + std::to_string(s.keys.size());
  for (kv::BlockId b : s.blocks)
    for (std::size_t p = 0; p < r.planes.size(); ++p)
      if (b >= r.planes[p].num_blocks)
        return "block " + std::to_string(b) + " is outside plane '" + l.planes[p].name + "' (" +
               std::to_string(r.planes[p].num_blocks) + " blocks)";
  for (std::int32_t slot : s.state_slots)
    if (slot >= 0 && static_cast<std::uint32_t>(slot) >= r.state.slots)
      return "state slot " + std::to_string(slot) + " is outside the state memory";
  return std::nullopt;
}
}  // namespace

std::optional<std::string> Registration::check_save(const kv::TransferSpec& s) const {
  if (auto e = check_common(*this, s)) return e;
  if (s.tokens.begin % layout.chunk_tokens != 0 || s.tokens.end % layout.chunk_tokens != 0)
    return "a save covers whole chunks";
  if (s.with_state && s.state_slots.size() != s.keys.size()) return "a save with state needs one slot per chunk";
  return std::nullopt;
}

std::optional<std::string> Registration::check_load(const kv::TransferSpec& s) const {
  if (auto e = check_common(*this, s)) return e;
  if (s.with_state) {
    if (s.tokens.end % layout.chunk_tokens != 0) return "a load with state ends on a chunk boundary";
    if (s.state_slots.size() != 1 || s.state_slots[0] < 0) return "a load with state needs one destination slot";
  }
  return std::nullopt;
}

}  // namespace kvstrand

namespace kvstrand::reactor {

std::vector<hip::Segment> segments(const Registration& reg, const kv::TransferSpec& s,
                                   const std::vector<std::byte*>& objects, bool save, const std::vector<bool>& images) {
  const kv::Layout& l = reg.layout;
  const std::uint32_t bpc = l.blocks_per_chunk();
  const std::uint32_t first_chunk = s.tokens.begin / l.chunk_tokens;
  std::vector<hip::Segment> segs;
  segs.reserve(s.blocks.size() * reg.planes.size() + objects.size());
  std::uint64_t plane_off = 0;
  for (std::size_t p = 0; p < reg.planes.size(); ++p) {
    const std::uint64_t bpb = l.planes[p].bytes_per_block;
    auto* plane = static_cast<std::byte*>(reg.planes[p].base);
    for (std::size_t i = 0; i < s.blocks.size(); ++i) {
      const std::uint32_t block_index = s.tokens.begin / l.block_tokens + static_cast<std::uint32_t>(i);
      const std::uint32_t chunk = block_index / bpc - first_chunk;
      const std::uint32_t in_chunk = block_index % bpc;
      if (objects[chunk] == nullptr) continue;  // chunk skipped (already stored)
      std::byte* dev = plane + static_cast<std::uint64_t>(s.blocks[i]) * bpb;
      std::byte* obj = objects[chunk] + plane_off * bpc + in_chunk * bpb;
      segs.push_back(save ? hip::Segment{dev, obj, bpb} : hip::Segment{obj, dev, bpb});
    }
    plane_off += bpb;
  }
  auto* state = static_cast<std::byte*>(reg.state.base);
  for (std::size_t c = 0; c < objects.size(); ++c) {
    if (objects[c] == nullptr || !images[c]) continue;
    const std::int32_t slot = save ? s.state_slots[c] : s.state_slots[0];
    std::byte* dev = state + static_cast<std::uint64_t>(slot) * l.checkpoint.image_bytes;
    std::byte* obj = objects[c] + reg.image_offset();
    segs.push_back(save ? hip::Segment{dev, obj, l.checkpoint.image_bytes}
                        : hip::Segment{obj, dev, l.checkpoint.image_bytes});
  }
  return segs;
}

}  // namespace kvstrand::reactor
