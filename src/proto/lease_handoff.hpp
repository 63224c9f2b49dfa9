// A lookup's lease as bytes: what a scheduler process hands a worker process
// (in the engine's own per-step metadata) so that the worker loads what the
// scheduler looked up. Pure: no I/O.
//
// The bytes name the lease and the chunks it holds; they grant nothing by
// themselves: the worker's Connector asks its kvstrand-server to move the
// lease to its own session, and the server checks that the lease still
// holds exactly those chunks (a lease id from another server, or one
// since ended, is a miss).
#pragma once

#include "common/expected.hpp"
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <kvstrand/chunk_keys.hpp>

namespace kvstrand::proto {

using kv::ChunkKey;

struct LeaseHandoff {
  std::uint64_t lease = 0;
  std::vector<ChunkKey> keys;  // the hit's chunks, in order (at least one)
};

std::vector<std::byte> encode_lease_handoff(const LeaseHandoff& h);
// None, with why, for bytes that are not a whole handoff of this version.
common::Expected<LeaseHandoff> decode_lease_handoff(std::span<const std::byte> bytes);

}  // namespace kvstrand::proto
