// The copies of a TransferSpec between a registration's device blocks and
// one tier object per chunk (the object's format: tier/object_format.hpp),
// and what the Connector counts of a spec's state slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <kvstrand/registration.hpp>
#include "device/copy.hpp"
#include "tier/object_format.hpp"

namespace kvstrand::data_path {

using kvstrand::PlaneMemory;
using kvstrand::Registration;
using kvstrand::StateMemory;

// Segments moving the spec's blocks to (save) or from (load) the objects,
// object i of the spec's keys at objects[i] (nullptr: skip that chunk).
// `images[i]`: copy chunk i's image (save); for a load the image goes with
// the last object.
// Written over `into` (its capacity kept: HostTier plans every copy into
// one buffer, so a copy's plan allocates nothing).
void segments_into(const Registration& reg, const kv::TransferSpec& s, const std::vector<std::byte*>& objects,
                   bool save, const std::vector<bool>& images, std::vector<device::Segment>& into);

using tier::state_part;
using tier::state_part_bytes;
// Every state memory's slots, numbered one after another (memory 0's
// first): how the Connector counts the slots live transfers use.
std::uint32_t state_slot_count(const Registration& reg);
// Calls f(slot in that numbering) for every slot the spec names; stops at
// the first call that returns true, and returns whether one did. Allocates
// nothing: the Connector's checks run on the step thread.
template <class F>
bool any_slot_use(const Registration& reg, const kv::TransferSpec& s, F&& f) {
  if (!s.with_state) return false;
  const std::size_t parts = reg.state_part_count();
  std::int32_t first = 0;  // state memory (i % parts)'s first slot
  for (std::size_t i = 0; i < s.state_slots.size(); ++i) {
    if (i % parts == 0) first = 0;
    if (s.state_slots[i] >= 0 && f(first + s.state_slots[i])) return true;
    first += static_cast<std::int32_t>(state_part(reg, i % parts).slots);
  }
  return false;
}
// Images the spec moves (chunks with a slot named, each in every memory).
std::uint32_t images_of(const Registration& reg, const kv::TransferSpec& s);

}  // namespace kvstrand::data_path
