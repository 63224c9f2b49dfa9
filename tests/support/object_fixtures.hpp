// Chunk keys and objects for the stored-object format's tests
// (test_object_header, test_chunk_value) and test_tier_events: distinct, reproducible bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <kvstrand/chunk_keys.hpp>

namespace kvstrand::test {

inline kv::ChunkKey key(std::uint8_t n, std::uint32_t rank = 0) {
  kv::ChunkKey k;
  for (std::size_t i = 0; i < k.ns.size(); ++i) k.ns[i] = static_cast<std::byte>(0xA0 + i);
  k.kv_rank = rank;
  for (std::size_t i = 0; i < k.hash.size(); ++i) k.hash[i] = static_cast<std::byte>(n + i);
  return k;
}

inline std::vector<std::byte> object(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> o(n);
  for (std::size_t i = 0; i < n; ++i) o[i] = static_cast<std::byte>((seed * 2654435761u + i * 40503u) >> 7);
  return o;
}

}  // namespace kvstrand::test
