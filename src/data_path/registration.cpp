#include "data_path/registration.hpp"

#include <kvstrand/transfer_spec.hpp>

#include <algorithm>
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
  if (!layout.has_state()) {
    if (!state_parts.empty()) return "register_layout: state memories were given for a layout without recurrent state";
    return std::nullopt;
  }
  if (state_parts.empty()) {
    if (state.base == nullptr || state.slots == 0)
      return "register_layout: the layout has recurrent state but no state memory was given";
    if (state.slot_bytes != 0 && state.slot_bytes != layout.checkpoint.image_bytes)
      return "register_layout: state: slot_bytes " + std::to_string(state.slot_bytes) + " is not the image's " +
             std::to_string(layout.checkpoint.image_bytes) + " bytes (0 means the whole image)";
  } else if (state.base != nullptr || state.slots != 0) {
    return "register_layout: give the state memory as `state` or as `state_parts`, not both";
  }
  std::uint64_t image = 0;
  for (std::size_t p = 0; p < state_part_count(); ++p) {
    const StateMemory& m = tier::state_part(*this, p);
    const std::uint64_t bytes = tier::state_part_bytes(*this, p);
    const std::string name = state_parts.empty() ? "state" : "state_parts[" + std::to_string(p) + "]";
    if (m.base == nullptr || m.slots == 0 || bytes == 0)
      return "register_layout: " + name + " has no device memory (base, slots and slot_bytes are needed)";
    if (__builtin_mul_overflow(std::uint64_t{m.slots}, bytes, &end) ||
        __builtin_add_overflow(reinterpret_cast<std::uintptr_t>(m.base), end, &end) ||
        __builtin_add_overflow(image, bytes, &image))
      return "register_layout: " + name + ": slots x slot_bytes runs past the address space";
  }
  if (image != layout.checkpoint.image_bytes)
    return "register_layout: the state memories' slot_bytes add up to " + std::to_string(image) +
           " bytes, the layout's checkpoint.image_bytes is " + std::to_string(layout.checkpoint.image_bytes);
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
  // One compare a block (this runs on the step thread, per post): against
  // the smallest plane, which is the one named when a block is outside.
  std::size_t smallest = 0;
  for (std::size_t p = 1; p < r.planes.size(); ++p)
    if (r.planes[p].num_blocks < r.planes[smallest].num_blocks) smallest = p;
  const std::uint32_t limit = r.planes.empty() ? UINT32_MAX : r.planes[smallest].num_blocks;
  for (kv::BlockId b : s.blocks)
    if (b >= limit)
      return "block " + std::to_string(b) + " is outside plane '" + l.planes[smallest].name + "' (" +
             std::to_string(limit) + " blocks)";
  const std::size_t parts = r.state_part_count();
  for (std::size_t i = 0; i < s.state_slots.size(); ++i) {
    const std::int32_t slot = s.state_slots[i];
    if (slot >= 0 && static_cast<std::uint32_t>(slot) >= tier::state_part(r, i % parts).slots)
      return "state slot " + std::to_string(slot) + " is outside the state memory" +
             (parts > 1 ? " state_parts[" + std::to_string(i % parts) + "]" : std::string());
  }
  return std::nullopt;
}
}  // namespace

std::optional<std::string> Registration::check_save(const kv::TransferSpec& s) const {
  if (auto e = check_common(*this, s)) return e;
  if (s.tokens.begin % layout.chunk_tokens != 0 || s.tokens.end % layout.chunk_tokens != 0)
    return "a save covers whole chunks";
  if (!s.with_state) return std::nullopt;
  const std::size_t parts = state_part_count();
  if (s.state_slots.size() != s.keys.size() * parts)
    return parts == 1 ? std::string("a save with state needs one slot per chunk")
                      : "a save with state needs one slot per chunk and state memory (" + std::to_string(parts) + ")";
  for (std::size_t c = 0; c < s.keys.size(); ++c)
    for (std::size_t p = 1; p < parts; ++p)
      if ((s.state_slots[c * parts] >= 0) != (s.state_slots[c * parts + p] >= 0))
        return "chunk " + std::to_string(c) + " names an image slot in some state memories and not in others";
  return std::nullopt;
}

std::optional<std::string> Registration::check_load(const kv::TransferSpec& s) const {
  if (auto e = check_common(*this, s)) return e;
  if (s.with_state) {
    if (s.tokens.end % layout.chunk_tokens != 0) return "a load with state ends on a chunk boundary";
    const std::size_t parts = state_part_count();
    if (s.state_slots.size() != parts ||
        std::any_of(s.state_slots.begin(), s.state_slots.end(), [](std::int32_t slot) { return slot < 0; }))
      return parts == 1 ? std::string("a load with state needs one destination slot")
                        : "a load with state needs one destination slot per state memory (" + std::to_string(parts) + ")";
  }
  return std::nullopt;
}

}  // namespace kvstrand

namespace kvstrand::data_path {

void segments_into(const Registration& reg, const kv::TransferSpec& s, const std::vector<std::byte*>& objects,
                   bool save, const std::vector<bool>& images, std::vector<device::Segment>& into) {
  into.clear();
  into.reserve(s.blocks.size() * reg.planes.size() + objects.size());
  tier::for_each_piece(reg, s, objects, save, images, [&](std::byte* dev, std::byte* obj, std::uint64_t bytes) {
    into.push_back(save ? device::Segment{dev, obj, bytes} : device::Segment{obj, dev, bytes});
  });
}

std::uint32_t state_slot_count(const Registration& reg) {
  std::uint32_t n = 0;
  for (std::size_t p = 0; p < reg.state_part_count(); ++p) n += state_part(reg, p).slots;
  return n;
}

std::uint32_t images_of(const Registration& reg, const kv::TransferSpec& s) {
  if (!s.with_state) return 0;
  std::uint32_t n = 0;
  for (std::int32_t slot : s.state_slots) n += slot >= 0;
  return n / static_cast<std::uint32_t>(reg.state_part_count());
}

}  // namespace kvstrand::data_path
