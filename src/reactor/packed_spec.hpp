// A TransferSpec packed into one contiguous run of words: what submit()
// hands the strand for each transfer.
//
// The strand reads what the engine's thread wrote, and every line it reads
// must cross between their cores, and cross back when the engine's thread
// writes that memory again. A spec spreads over its own object and a buffer
// per vector, which the engine's allocator recycles into the engine's own
// code; packed, a one-chunk save is three or four lines of memory kvstrand
// keeps (the live entry's, reused from transfer to transfer), and the strand
// unpacks it into a spec of its own. docs/PERFORMANCE.md ("Step-thread
// cost") has the measurement.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <kvstrand/transfer_spec.hpp>

namespace kvstrand::reactor {

// Writes `spec` over `into` (its capacity reused).
void pack(const kv::TransferSpec& spec, std::vector<std::uint32_t>& into);

// The spec `pack` wrote.
kv::TransferSpec unpack(std::span<const std::uint32_t> packed);

}  // namespace kvstrand::reactor
