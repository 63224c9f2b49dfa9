// The mapping from a TransferSpec to copy segments between a registration's
// device blocks and one tier object per chunk (the object's format is in
// include/kvstrand/registration.hpp).
#pragma once

#include <cstddef>
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

}  // namespace kvstrand::reactor
