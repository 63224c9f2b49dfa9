// The mapping from a TransferSpec to copy segments between a registration's
// device blocks and one tier object per chunk (the object's format is in
// include/kvstrand/registration.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <kvstrand/registration.hpp>
#include "hip/copy.hpp"

namespace kvstrand::reactor {

using kvstrand::PlaneMemory;
using kvstrand::Registration;
using kvstrand::StateMemory;

// Segments moving the spec's blocks to (save) or from (load) the objects,
// object i of the spec's keys at objects[i] (nullptr: skip that chunk).
// `images[i]`: copy chunk i's image (save); for a load the image goes with
// the last object.
std::vector<hip::Segment> segments(const Registration& reg, const kv::TransferSpec& s,
                                   const std::vector<std::byte*>& objects, bool save, const std::vector<bool>& images);

// State memory p of the registration (its `state` when it has no
// state_parts), and the bytes of one of its slots.
const StateMemory& state_part(const Registration& reg, std::size_t p);
std::uint64_t state_part_bytes(const Registration& reg, std::size_t p);
// Every state memory's slots, numbered one after another (memory 0's
// first): how the Connector counts the slots live transfers use.
std::uint32_t state_slot_count(const Registration& reg);
std::vector<std::int32_t> slot_uses(const Registration& reg, const kv::TransferSpec& s);
// Images the spec moves (chunks with a slot named, each in every memory).
std::uint32_t images_of(const Registration& reg, const kv::TransferSpec& s);

}  // namespace kvstrand::reactor
