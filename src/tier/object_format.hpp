// The format of a tier object: one chunk of a registration's KV and, for a
// chunk end that keeps one, its state image. The embedded index and
// kvstrand-server hand out objects of this size; the copies in and out of
// them follow it:
//
//   [plane 0: the chunk's blocks in order][plane 1: ...]...[image]
//
// the image (at Registration::image_offset()) being each state memory's
// slot in turn (one memory unless Registration::state_parts names several).
// Header-only and device-free: it names addresses, the caller copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <kvstrand/registration.hpp>
#include <kvstrand/transfer_spec.hpp>

namespace kvstrand::tier {

// State memory p of the registration (its `state` when it has no
// state_parts), and the bytes of one of its slots.
inline const StateMemory& state_part(const Registration& reg, std::size_t p) {
  return reg.state_parts.empty() ? reg.state : reg.state_parts[p];
}
inline std::uint64_t state_part_bytes(const Registration& reg, std::size_t p) {
  if (reg.state_parts.empty()) return reg.layout.checkpoint.image_bytes;
  return reg.state_parts[p].slot_bytes;
}

// Calls f(device, object, bytes) for every contiguous piece the spec moves
// between the registration's device memory and the objects: chunk i of the
// spec's keys is objects[i] (nullptr: that chunk is skipped). images[i]:
// chunk i's image moves too; a save reads it from the spec's slot for that
// chunk, a load writes the slots its spec names (one per state memory).
template <class F>
void for_each_piece(const Registration& reg, const kv::TransferSpec& s, const std::vector<std::byte*>& objects,
                    bool save, const std::vector<bool>& images, F&& f) {
  const kv::Layout& l = reg.layout;
  const std::uint32_t bpc = l.blocks_per_chunk();
  const std::uint32_t first_chunk = s.tokens.begin / l.chunk_tokens;
  std::uint64_t plane_off = 0;
  for (std::size_t p = 0; p < reg.planes.size(); ++p) {
    const std::uint64_t bpb = l.planes[p].bytes_per_block;
    auto* plane = static_cast<std::byte*>(reg.planes[p].base);
    for (std::size_t i = 0; i < s.blocks.size(); ++i) {
      const std::uint32_t block_index = s.tokens.begin / l.block_tokens + static_cast<std::uint32_t>(i);
      const std::uint32_t chunk = block_index / bpc - first_chunk;
      const std::uint32_t in_chunk = block_index % bpc;
      if (objects[chunk] == nullptr) continue;
      f(plane + static_cast<std::uint64_t>(s.blocks[i]) * bpb, objects[chunk] + plane_off * bpc + in_chunk * bpb, bpb);
    }
    plane_off += bpb;
  }
  const std::size_t parts = reg.state_part_count();
  for (std::size_t c = 0; c < objects.size(); ++c) {
    if (objects[c] == nullptr || !images[c]) continue;
    std::byte* obj = objects[c] + reg.image_offset();
    for (std::size_t p = 0; p < parts; ++p) {
      const std::int32_t slot = save ? s.state_slots[c * parts + p] : s.state_slots[p];
      const std::uint64_t bytes = state_part_bytes(reg, p);
      f(static_cast<std::byte*>(state_part(reg, p).base) + static_cast<std::uint64_t>(slot) * bytes, obj, bytes);
      obj += bytes;
    }
  }
}

}  // namespace kvstrand::tier
